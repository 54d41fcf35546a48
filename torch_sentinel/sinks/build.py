"""Which sinks a run gets. Kept apart from ``base.py`` so that the concrete sinks import the
base and nothing imports back (no import cycle, not even a lazy one)."""

from __future__ import annotations

import os

from .base import Sink, SinkContext
from .console import ConsoleSink
from .jsonl import JsonlSink
from .precision import PrecisionFileSink
from .tensorboard import TensorBoardSink

__all__ = ["build_sinks"]


def _prepare_log_dir(ctx: SinkContext) -> bool:
    """Create the log directory up front, so an unwritable one is reported at attach()."""
    assert ctx.log_dir is not None
    try:
        os.makedirs(ctx.log_dir, exist_ok=True)
        if not os.access(ctx.log_dir, os.W_OK | os.X_OK):
            raise PermissionError(f"no write permission on {ctx.log_dir!r}")
    except OSError as exc:
        ctx.log_dir_failure("creating the directory", exc)
        return False
    return True


def build_sinks(ctx: SinkContext) -> list[Sink]:
    """The sinks for a run: console logging always; TensorBoard, JSONL and the precision rows
    with a log_dir."""
    sinks: list[Sink] = [ConsoleSink(ctx)]
    if ctx.log_dir is not None and ctx.is_writer and _prepare_log_dir(ctx):
        sinks.append(JsonlSink(ctx))
        sinks.append(TensorBoardSink(ctx))
        sinks.append(PrecisionFileSink(ctx))
    return sinks
