"""Hugging Face ``Trainer``: ``SentinelTrainerCallback.install(trainer)`` and the run is watched.

The callback attaches at ``on_train_begin`` to the model and the optimizer the Trainer built
(unwrapped from accelerate's wrapper), writes next to the Trainer's TensorBoard events, feeds
``eval_loss`` to the curve detectors, and detaches at ``on_train_end``. A
:class:`~torch_sentinel.NonFiniteError` propagates out of ``trainer.train()``. The Trainer
filters NaN losses out of its own logs by default; the sentinel does not.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Optional

from transformers import TrainerCallback

from .._api import Sentinel, attach
from ._common import detach_quietly, torch_optimizers

__all__ = ["SentinelTrainerCallback"]


class SentinelTrainerCallback(TrainerCallback):
    """Attach torch_sentinel to the model the Trainer trains.

    Args:
        log_dir: where to write; by default the Trainer's TensorBoard directory.
        **options: anything :func:`torch_sentinel.attach` accepts.
    """

    def __init__(self, log_dir: Optional[str] = None, **options: Any) -> None:
        self._log_dir = log_dir
        self._options = options
        self._trainer: Optional[weakref.ref[Any]] = None
        self.sentinel: Optional[Sentinel] = None

    @classmethod
    def install(cls, trainer: Any, log_dir: Optional[str] = None, **options: Any) -> SentinelTrainerCallback:
        """Add the callback to ``trainer``; it then finds the Trainer's TensorBoard directory."""
        callback = cls(log_dir, **options)
        callback._trainer = weakref.ref(trainer)
        trainer.add_callback(callback)
        return callback

    def _tensorboard_dir(self, args: Any) -> str:
        trainer = self._trainer() if self._trainer is not None else None
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
        self.sentinel = attach(
            model,
            torch_optimizers([optimizer] if optimizer is not None else []),
            log_dir=self._log_dir or self._tensorboard_dir(args),
            **self._options,
        )

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Optional[dict[str, Any]] = None,
                    **kwargs: Any) -> None:
        if self.sentinel is not None and self.sentinel.attached and metrics and "eval_loss" in metrics:
            self.sentinel.observe_validation(float(metrics["eval_loss"]))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.sentinel is not None and self.sentinel.attached:
            self.sentinel.detach()

    def close_after_error(self) -> None:
        """Detach after ``trainer.train()`` raised (the Trainer has no exception callback)."""
        detach_quietly(self.sentinel)
