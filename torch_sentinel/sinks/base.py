"""The sink protocol, kept tiny: ``write`` a flushed window, ``close`` at detach."""

from __future__ import annotations

import dataclasses
import logging
import threading
import warnings
from collections.abc import Sequence
from typing import Any, Optional, Protocol

from .._findings import Finding
from .._record import StepRecord

__all__ = ["Sink", "SinkContext"]

logger = logging.getLogger("torch_sentinel")


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
    #: Steps between writes of per-module scalars; None: chosen from the model's size
    #: (see :mod:`torch_sentinel.sinks.schedule`).
    module_log_every: Optional[int] = None
    #: Set once a write under log_dir failed and the user was warned.
    log_dir_failed: bool = False
    _lock: threading.Lock = dataclasses.field(
        default_factory=threading.Lock, repr=False, compare=False
    )

    def log_dir_failure(self, what: str, exc: BaseException) -> None:
        """Warn once per run that the log directory failed, from whichever sink saw it first.

        Losing logs must never stop training, and a full disk makes every sink fail at once: one
        warning says it all, the rest would be noise.
        """
        with self._lock:
            if self.log_dir_failed:
                return
            self.log_dir_failed = True
        message = (
            f"torch_sentinel cannot write to log_dir {self.log_dir!r} ({what}: "
            f"{type(exc).__name__}: {exc}). Training continues; TensorBoard and findings.jsonl "
            "stop here, and every finding stays available from sentinel.report()."
        )
        logger.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)


class Sink(Protocol):
    """``write`` gets each flushed window of step records and the findings new in it.

    Optional methods a sink may add, called when present:
    ``write_stats(step, {tag: value})`` for detectors' statistics (tags ``detector/<kind>/<name>``)
    and ``write_note(entry)`` for experiment-log entries from ``Sentinel.note``, and ``flush()``
    to put everything written so far on disk now (from ``Sentinel.flush()``; cold path).
    """

    def write(self, records: Sequence[StepRecord], findings: Sequence[Finding]) -> None: ...

    def close(self) -> None: ...
