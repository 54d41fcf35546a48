"""Hugging Face ``Trainer``: ``SentinelTrainerCallback.install(trainer)`` and the run is watched.

- **When:** the callback attaches at ``on_train_begin``, once the Trainer has prepared the model
  and built the optimizer (unwrapped from accelerate's wrapper), and detaches at
  ``on_train_end``, or when ``trainer.train()`` raises (no ``close_after_error()`` needed, also
  for a callback passed as ``Trainer(callbacks=[...])``: ``Trainer.train`` is watched for an
  exception leaving it, for Trainers that hold this callback only).
- **Steps:** the sentinel counts as ``state.global_step`` does (the first step is 1), in
  errors, findings and logs.
- **Logs:** at the Trainer's own log cadence (``logging_steps``), after the sentinel's flush,
  the global scalars (``sentinel/loss``, ``sentinel/grad_norm`` before clipping, which equals
  the Trainer's ``grad_norm``, ``sentinel/grad_norm_clipped``, ``sentinel/update_ratio``,
  ``sentinel/nonfinite``, ``sentinel/findings``) go through ``Trainer.log``, so every
  ``report_to`` integration (TensorBoard, W&B, MLflow, ...) and ``state.log_history`` get them.
  Findings go to the ``transformers`` console logger. The per-module detail goes to the
  sentinel's TensorBoard files next to the Trainer's.
- ``eval_loss`` feeds the curve detectors. A :class:`~torch_sentinel.NonFiniteError`
  propagates out of ``trainer.train()``; the Trainer filters NaN losses out of its own logs by
  default, the sentinel does not.

``Trainer(callbacks=[SentinelTrainerCallback()])`` works too, but a callback added that way
cannot reach the Trainer: the scalars then stay in the sentinel's TensorBoard files.
"""

from __future__ import annotations

import functools
import os
import weakref
from typing import Any, Callable, Optional

import transformers
from transformers import TrainerCallback
from transformers.utils import logging as hf_logging

from .._api import Sentinel
from .._attach import attach
from .._collect.patches import RAISED, patch_for
from ..sinks.framework import FrameworkSink
from ._common import detach_quietly, forward_findings, torch_optimizers

__all__ = ["SentinelTrainerCallback"]

console = hf_logging.get_logger("transformers.trainer")


class SentinelTrainerCallback(TrainerCallback):
    """Attach torch_sentinel to the model the Trainer trains.

    Args:
        log_dir: where the sentinel's own files go; by default the Trainer's TensorBoard directory.
        log_to_trainer: send the global scalars through ``Trainer.log``.
        **options: anything :func:`torch_sentinel.attach` accepts.
    """

    def __init__(self, log_dir: Optional[str] = None, log_to_trainer: bool = True, **options: Any) -> None:
        self._log_dir = log_dir
        self._log_to_trainer = log_to_trainer
        self._options = options
        self._trainer: Optional[weakref.ref[Any]] = None
        self._sink: Optional[FrameworkSink] = None
        self.sentinel: Optional[Sentinel] = None
        # A callback passed as Trainer(callbacks=[...]) never sees its Trainer before train()
        # runs, so it cannot wrap that call as install() does: Trainer.train is watched for an
        # exception leaving it (a process-wide patch, shared and removed with the last callback).
        watch = _TrainExit(self)
        patch = patch_for(transformers.Trainer, "train")
        patch.add(watch)
        weakref.finalize(self, patch.remove, watch)

    @classmethod
    def install(cls, trainer: Any, log_dir: Optional[str] = None, **options: Any) -> SentinelTrainerCallback:
        """Add the callback to ``trainer``: the one line. It then logs through the Trainer,
        finds its TensorBoard directory, and detaches when ``trainer.train()`` raises."""
        callback = cls(log_dir, **options)
        callback.log_through(trainer)
        trainer.add_callback(callback)
        train = trainer.train

        @functools.wraps(train)
        def train_and_detach_on_error(*args: Any, **kwargs: Any) -> Any:
            try:
                return train(*args, **kwargs)
            except BaseException:
                callback.close_after_error()
                raise

        # An instance attribute: this trainer only, and the Trainer class stays untouched.
        trainer.train = train_and_detach_on_error
        return callback

    def log_through(self, trainer: Any) -> None:
        """Send the scalars through ``trainer.log`` (``install()`` calls it; held weakly).

        Args:
            trainer: the ``transformers.Trainer`` this callback is added to.
        """
        self._trainer = weakref.ref(trainer)

    def _get_trainer(self) -> Any:
        return self._trainer() if self._trainer is not None else None

    def _tensorboard_dir(self, args: Any) -> str:
        trainer = self._get_trainer()
        for cb in getattr(getattr(trainer, "callback_handler", None), "callbacks", []):
            # TensorBoardCallback settles its directory in its own on_train_begin, which runs
            # before ours (report_to callbacks are added first).
            if type(cb).__name__ == "TensorBoardCallback" and getattr(cb, "logging_dir", None):
                return str(cb.logging_dir)
        for candidate in (getattr(args, "logging_dir", None), os.environ.get("TENSORBOARD_LOGGING_DIR")):
            if candidate:
                return str(candidate)
        return os.path.join(args.output_dir, "runs", "torch_sentinel")

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       optimizer: Any = None, **kwargs: Any) -> None:
        detach_quietly(self.sentinel)
        options = dict(self._options)
        # The Trainer numbers a step once it is done: the first step is state.global_step 1.
        options.setdefault("start_step", int(state.global_step) + 1)
        self.sentinel = attach(
            model,
            torch_optimizers([optimizer] if optimizer is not None else []),
            log_dir=self._log_dir or self._tensorboard_dir(args),
            **options,
        )
        self._sink = FrameworkSink(self.sentinel.context.param_owner)
        self.sentinel.add_sink(self._sink)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # DefaultFlowCallback (always first) has decided whether the Trainer logs this step;
        # the Trainer reads the loss to the host right after, so the flush adds no sync of its own.
        if control.should_log and self.sentinel is not None and self.sentinel.attached:
            self.sentinel.flush()
            self._log(state)

    def _log(self, state: Any) -> None:
        sink = self._sink
        if sink is None:
            return
        forward_findings(sink, console.warning, "state.global_step")
        rows = sink.take()
        trainer = self._get_trainer()
        if not rows or not self._log_to_trainer or trainer is None:
            return
        step, metrics = rows[-1]
        if step == state.global_step:  # Trainer.log stamps the Trainer's step
            log: Callable[[dict[str, float]], None] = trainer.log
            log(dict(metrics))
            # Trainer.log's on_log clears should_log; the Trainer's own log of this step follows.
            trainer.control.should_log = True

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Optional[dict[str, Any]] = None,
                    **kwargs: Any) -> None:
        if self.sentinel is not None and self.sentinel.attached and metrics and "eval_loss" in metrics:
            self.sentinel.observe_validation(float(metrics["eval_loss"]))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.sentinel is not None and self.sentinel.attached:
            self.sentinel.detach()
            if self._sink is not None:
                forward_findings(self._sink, console.warning, "state.global_step")

    def close_after_error(self) -> None:
        """Detach after ``trainer.train()`` raised (done for you with :meth:`install`)."""
        detach_quietly(self.sentinel)
        if self._sink is not None:
            forward_findings(self._sink, console.warning, "state.global_step")


class _TrainExit:
    """Listens to ``Trainer.train``: an exception leaving it closes the callback's sentinel,
    when that Trainer holds the callback. Holds the callback weakly."""

    def __init__(self, callback: SentinelTrainerCallback) -> None:
        self._callback = weakref.ref(callback)

    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        return None

    def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        callback = self._callback()
        if callback is None or result is not RAISED or not args:
            return
        handler = getattr(args[0], "callback_handler", None)
        if any(cb is callback for cb in getattr(handler, "callbacks", ())):
            callback.close_after_error()
