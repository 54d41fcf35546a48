"""The sink protocol, kept tiny: ``write`` a flushed window, ``close`` at detach."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Optional, Protocol

from .._collect.records import StepRecord
from .._findings import Finding

__all__ = ["Sink", "SinkContext", "build_sinks"]


@dataclasses.dataclass
class SinkContext:
    """What sinks may need besides the records: where to write and what the run is."""

    log_dir: Optional[str]
    log_every: int
    rank: Optional[int]
    is_writer: bool
    manifest: dict[str, Any] = dataclasses.field(default_factory=dict)
    module_names: list[str] = dataclasses.field(default_factory=list)
    param_owner: dict[str, str] = dataclasses.field(default_factory=dict)


class Sink(Protocol):
    """``write`` gets each flushed window of step records and the findings new in it.

    Optional methods a sink may add, called when present:
    ``write_stats(step, {tag: value})`` for detectors' statistics (tags ``detector/<kind>/<name>``)
    and ``write_note(entry)`` for experiment-log entries from ``Sentinel.note``.
    """

    def write(self, records: Sequence[StepRecord], findings: Sequence[Finding]) -> None: ...

    def close(self) -> None: ...


def build_sinks(ctx: SinkContext) -> list[Sink]:
    """The sinks for a run: console logging always; TensorBoard and JSONL with a log_dir."""
    sinks: list[Sink] = []
    try:
        from .console import ConsoleSink
    except ImportError:  # pragma: no cover - sink not built yet
        pass
    else:
        sinks.append(ConsoleSink(ctx))
    if ctx.log_dir is not None and ctx.is_writer:
        try:
            from .jsonl import JsonlSink
            from .tensorboard import TensorBoardSink
        except ImportError:  # pragma: no cover - sink not built yet
            pass
        else:
            sinks.append(JsonlSink(ctx))
            sinks.append(TensorBoardSink(ctx))
    return sinks
