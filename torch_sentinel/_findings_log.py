"""Every finding of one sentinel, each once, and the sinks it goes to.

A finding is known by its kind, module and rung: a detector that gives the same one again (at
every flush, or once more when the run ends) adds nothing. What is new goes to the sinks
(TensorBoard, ``findings.jsonl``, the console); a sink that fails is logged, never the reason
training stops.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, Callable, Optional

from ._findings import Finding
from ._record import StepRecord

__all__ = ["FindingLog", "safely"]

logger = logging.getLogger("torch_sentinel")


def safely(fn: Callable[..., Any], *args: Any) -> None:
    """Call ``fn``; an exception is logged (logging and sinks must never stop training)."""
    try:
        fn(*args)
    except Exception as exc:
        logger.warning("torch_sentinel: %s failed: %s", getattr(fn, "__qualname__", fn), exc)


class FindingLog:
    """The findings so far, in the order found, and the sinks that get each new one.

    Args:
        sinks: objects with ``write(records, findings)`` and ``close()`` (``sinks/base.py``).
    """

    def __init__(self, sinks: list[Any]) -> None:
        self.sinks = sinks
        self.findings: list[Finding] = []
        self._keys: set[tuple[str, Optional[str], str]] = set()
        #: ``Sentinel.note`` entries (the experiment log).
        self.notes: list[dict[str, Any]] = []

    def add(self, findings: Iterable[Finding], write: bool = False) -> list[Finding]:
        """Keep the findings not seen before; with ``write``, send them to the sinks now
        (otherwise they go with the window of records they came from)."""
        added = []
        for f in findings:
            key = (f.kind, f.module, f.boundary)
            if key in self._keys:
                continue
            self._keys.add(key)
            self.findings.append(f)
            added.append(f)
        if write and added:
            self.write([], added)
        return added

    def write(self, records: Sequence[StepRecord], findings: Sequence[Finding]) -> None:
        for sink in self.sinks:
            safely(sink.write, records, findings)

    def write_stats(self, step: int, stats: dict[str, float]) -> None:
        for sink in self.sinks:
            write_stats = getattr(sink, "write_stats", None)
            if write_stats is not None:
                safely(write_stats, step, stats)

    def note(self, entry: dict[str, Any]) -> None:
        self.notes.append(entry)
        for sink in self.sinks:
            write_note = getattr(sink, "write_note", None)
            if write_note is not None:
                safely(write_note, entry)

    def flush(self) -> None:
        for sink in self.sinks:
            flush = getattr(sink, "flush", None)
            if flush is not None:
                safely(flush)

    def close(self) -> None:
        for sink in self.sinks:
            safely(sink.close)
