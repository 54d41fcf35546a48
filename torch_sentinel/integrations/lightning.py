"""Lightning: ``Trainer(callbacks=[SentinelCallback()])`` and the run is watched.

- **When:** the callback attaches at the first training batch, after Lightning has set up the
  module and the optimizers and after every ``on_train_start`` hook (a head replaced there is
  part of the model the sentinel maps), to the ``LightningModule`` and the trainer's optimizers.
- **Steps:** the sentinel counts in ``trainer.global_step``, also under manual optimization
  with several optimizers, in errors, findings and logs.
- **Logs:** the global scalars (``sentinel/loss``, ``sentinel/grad_norm`` before clipping,
  ``sentinel/grad_norm_clipped``, ``sentinel/update_ratio``, ``sentinel/nonfinite``,
  ``sentinel/findings``) go to every logger of the trainer (``logger.log_metrics``: TensorBoard,
  CSV, W&B, MLflow, ...) every ``log_every_n_steps``, taken from the sentinel's own flushes (no
  extra host sync). Findings go to Lightning's console logger. The per-module detail goes to
  the sentinel's TensorBoard files in the TensorBoard logger's directory.
- The validation loss feeds the curve detectors; a :class:`~torch_sentinel.NonFiniteError`
  propagates out of ``trainer.fit()`` like any error raised in a training step.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from lightning.pytorch import Callback, LightningModule, Trainer

from .._api import Sentinel
from .._attach import attach
from ..sinks.framework import FrameworkSink
from ._common import detach_quietly, forward_findings, torch_optimizers

__all__ = ["SentinelCallback"]

console = logging.getLogger("lightning.pytorch")


def _tensorboard_dir(trainer: Trainer) -> Optional[str]:
    """The directory Lightning's TensorBoard logger writes to, else the trainer's log_dir."""
    for logger in getattr(trainer, "loggers", []) or []:
        if type(logger).__name__ == "TensorBoardLogger":
            return str(logger.log_dir)
    log_dir = getattr(trainer, "log_dir", None)
    return str(log_dir) if log_dir else None


class SentinelCallback(Callback):
    """Attach torch_sentinel to the module being fit.

    Args:
        log_dir: where the sentinel's own files go; by default the TensorBoard logger's directory.
        val_loss_key: the logged metric fed to the sentinel as the validation loss.
        log_to_trainer: send the global scalars to the trainer's loggers.
        **options: anything :func:`torch_sentinel.attach` accepts.
    """

    def __init__(
        self, log_dir: Optional[str] = None, val_loss_key: str = "val_loss", log_to_trainer: bool = True,
        **options: Any,
    ) -> None:
        super().__init__()
        self._log_dir = log_dir
        self._val_loss_key = val_loss_key
        self._log_to_trainer = log_to_trainer
        self._options = options
        self._sink: Optional[FrameworkSink] = None
        self._pending_attach = False
        self.sentinel: Optional[Sentinel] = None

    # ------------------------------------------------------------------ attach
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        detach_quietly(self.sentinel)
        self.sentinel = None
        self._pending_attach = True

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if not self._pending_attach:
            return
        self._pending_attach = False
        options = dict(self._options)
        options.setdefault("start_step", int(trainer.global_step))
        self.sentinel = attach(
            pl_module,
            torch_optimizers(trainer.optimizers),
            log_dir=self._log_dir or _tensorboard_dir(trainer),
            step_source=lambda: int(trainer.global_step) + 1,
            **options,
        )
        self._sink = FrameworkSink(self.sentinel.context.param_owner)
        self.sentinel.add_sink(self._sink)

    # ------------------------------------------------------------------ logs
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._forward(trainer)

    def _forward(self, trainer: Trainer) -> None:
        """Hand what the sentinel's last flush brought to the loggers and the console."""
        sink = self._sink
        if sink is None:
            return
        forward_findings(sink, console.warning, "global_step")
        rows = sink.take()
        if not self._log_to_trainer or not rows:
            return
        every = max(int(getattr(trainer, "log_every_n_steps", 1) or 1), 1)
        last = rows[-1][0]
        for step, metrics in rows:
            # Lightning's cadence, plus any step with non-finite evidence and the newest step.
            if step % every == 0 or metrics["sentinel/nonfinite"] > 0 or step == last:
                for logger in trainer.loggers:
                    logger.log_metrics(metrics, step=step)

    # ------------------------------------------------------------------ validation, end
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        value = trainer.callback_metrics.get(self._val_loss_key)
        if self.sentinel is not None and self.sentinel.attached and value is not None and not trainer.sanity_checking:
            self.sentinel.observe_validation(value.detach() if hasattr(value, "detach") else float(value))

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        detach_quietly(self.sentinel)
        self._forward(trainer)
        self._save(trainer)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.sentinel is not None and self.sentinel.attached:
            self.sentinel.detach()
            self._forward(trainer)
            self._save(trainer)

    def _save(self, trainer: Trainer) -> None:
        if not self._log_to_trainer:
            return
        for logger in trainer.loggers:
            try:
                logger.save()
            except Exception as exc:  # logging must never be the reason training stops
                console.debug("torch_sentinel: saving %s failed: %s", type(logger).__name__, exc)
