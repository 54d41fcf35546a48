"""Lightning: ``Trainer(callbacks=[SentinelCallback()])`` and the run is watched.

The callback attaches at ``on_fit_start`` (the optimizers exist by then) to the
``LightningModule`` and the trainer's optimizers, writes into the logger's TensorBoard
directory, feeds the validation loss to the curve detectors, and detaches at ``teardown``.
A :class:`~torch_sentinel.NonFiniteError` propagates out of ``trainer.fit()`` like any error
raised in a training step.
"""

from __future__ import annotations

from typing import Any, Optional

from lightning.pytorch import Callback, LightningModule, Trainer

from .._api import Sentinel, attach
from ._common import detach_quietly, torch_optimizers

__all__ = ["SentinelCallback"]


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
        log_dir: where to write; by default the TensorBoard logger's directory.
        val_loss_key: the logged metric fed to the sentinel as the validation loss.
        **options: anything :func:`torch_sentinel.attach` accepts.
    """

    def __init__(self, log_dir: Optional[str] = None, val_loss_key: str = "val_loss", **options: Any) -> None:
        super().__init__()
        self._log_dir = log_dir
        self._val_loss_key = val_loss_key
        self._options = options
        self.sentinel: Optional[Sentinel] = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        detach_quietly(self.sentinel)
        self.sentinel = attach(
            pl_module,
            torch_optimizers(trainer.optimizers),
            log_dir=self._log_dir or _tensorboard_dir(trainer),
            **self._options,
        )

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        value = trainer.callback_metrics.get(self._val_loss_key)
        if self.sentinel is not None and value is not None and not trainer.sanity_checking:
            self.sentinel.observe_validation(value.detach() if hasattr(value, "detach") else float(value))

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        detach_quietly(self.sentinel)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.sentinel is not None and self.sentinel.attached:
            self.sentinel.detach()
