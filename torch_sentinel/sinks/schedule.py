"""How often the per-module scalars are written: bounded event files, full detail at a fault.

Global scalars (loss, lr, global gradient norm and update ratio, non-finite counts, AMP) are
small and written at every logged step. Per-module scalars (``grad_norm/<module>``,
``activation_absmax/<module>``, ``update_ratio/<module>``) grow with the model: a 125-module
transformer has ~260 of them, about 10 KB of events per step, 1 GB per 100k steps, and
TensorBoard slows to a crawl on such files. They are written every ``module_log_every`` steps.

The arithmetic of the default (``module_log_every=None``): one scalar event costs about
``EVENT_OVERHEAD_BYTES + len(tag)`` bytes in the file (record framing and CRCs, wall time, step,
the value; measured with ``benchmarks/log_volume.py``). At the first logged step the sink adds
this up over the model's per-module tags, ``B`` bytes, and picks the smallest interval in
``1, 2, 5, 10, 20, 50, ...`` with ``B / interval <= MODULE_BYTES_PER_STEP`` (2000 bytes).
The ~15 global tags add ~500 bytes per step, so a model of any size stays near or under
2.5 KB per step; the 125-module transformer gets an interval of 10 (~1.6 KB per step).

Around a fault the detail is never thinned: for a finding of severity warning or error at step
``s``, the steps ``s - interval + 1 .. s`` get their per-module scalars. Steps already written
without them are kept for this (host numbers only, at most one interval of them) and written
when the finding arrives; steps still on their way are written in full when they arrive.
What a step has is what was recorded: gradient, weight and update norms on every step; module
output maxima (``activation_absmax/*``) on sampled steps (``_collect/cadence.py``) and, in
immediate mode, on the step of a non-finite fault, whose forward is run again with every module
watched (``_collect/watching.py``).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Sequence
from typing import Optional

from .._findings import Finding
from .._record import StepRecord

__all__ = ["EVENT_OVERHEAD_BYTES", "MODULE_BYTES_PER_STEP", "ModuleSchedule", "auto_interval"]

#: Bytes of one scalar event besides its tag (framing, CRCs, wall time, step, value, metadata).
EVENT_OVERHEAD_BYTES = 32

#: Budget of the per-module scalars, in event bytes per training step, for the default interval.
MODULE_BYTES_PER_STEP = 2000

_NICE = (1, 2, 5)


def auto_interval(tag_bytes: int, budget: int = MODULE_BYTES_PER_STEP) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... that keeps ``tag_bytes`` per write under
    ``budget`` bytes per step (round intervals keep charts of several runs aligned)."""
    need = max(1, math.ceil(tag_bytes / max(budget, 1)))
    scale = 1
    while True:
        for nice in _NICE:
            if nice * scale >= need:
                return nice * scale
        scale *= 10


def module_tag_bytes(tags: Iterable[str]) -> int:
    """Estimated event bytes of one scalar per tag."""
    return sum(EVENT_OVERHEAD_BYTES + len(t.encode()) for t in tags)


class ModuleSchedule:
    """Decides, on the training thread, which logged steps carry the per-module scalars.

    Args:
        interval: write them every this many steps; None chooses it at the first step from the
            tags' size (see the module docstring).
        log_every: the interval of logged steps; the module interval is rounded up to a
            multiple of it, so module steps are logged steps.
    """

    def __init__(self, interval: Optional[int], log_every: int) -> None:
        self.log_every = log_every
        self.interval: Optional[int] = None if interval is None else self._align(interval)
        self._last_full = -1
        self._fault_until = -1
        self._held: collections.deque[StepRecord] = collections.deque()

    def _align(self, interval: int) -> int:
        return max(self.log_every, math.ceil(interval / self.log_every) * self.log_every)

    def choose(self, tag_bytes: int) -> int:
        """Fix the interval from the byte size of one write of every per-module tag."""
        if self.interval is None:
            self.interval = self._align(auto_interval(tag_bytes))
        return self.interval

    @property
    def last_full(self) -> int:
        """The last step written with its per-module scalars (-1: none yet)."""
        return self._last_full

    @property
    def decided(self) -> bool:
        return self.interval is not None

    def full(self, record: StepRecord) -> bool:
        """Whether this logged step gets its per-module scalars; if not, it is held for a fault."""
        interval = self.interval or 1
        if record.step % interval == 0 or self._around_fault(record.step):
            self._last_full = record.step
            self._held.clear()
            return True
        self._held.append(record)
        while len(self._held) > interval:
            self._held.popleft()
        return False

    def _around_fault(self, step: int) -> bool:
        """Within one interval up to a fault's step, and after the last step written in full
        (so each tag's steps stay in order in the file)."""
        interval = self.interval or 1
        return self._last_full < step <= self._fault_until and step > self._fault_until - interval

    def backfill(self, findings: Sequence[Finding]) -> list[StepRecord]:
        """The held steps up to the latest fault's step, to be written with their per-module
        scalars now; empty when no finding is a fault."""
        faults = [f for f in findings if f.is_fault]
        if not faults:
            return []
        steps = [f.step for f in faults]
        last = None if any(s is None for s in steps) else max(s for s in steps if s is not None)
        if last is not None:
            # A fault found inside a hook arrives before its step's record: that record and
            # the ones before it, still on their way, are written in full when they arrive.
            self._fault_until = max(self._fault_until, last)
        out = [
            r
            for r in self._held
            if (last is None and r.step > self._last_full) or self._around_fault(r.step)
        ]
        if out:
            self._last_full = out[-1].step
        self._held = collections.deque(r for r in self._held if r.step > self._last_full)
        return out
