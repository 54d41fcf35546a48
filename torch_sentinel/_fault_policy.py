"""What a non-finite fault becomes: a ``NonFiniteError`` raised, a warning, or a record.

A fault reaches the policy from three places: a hook in immediate mode, a landed row in
deferred mode, and (under torch.distributed) the ranks' agreement, which makes every rank
decide at the same step. ``on_nonfinite`` decides the rest: under ``"raise"`` every step with a
fault raises (a loop that catches the error and skips the batch stays protected); under
``"warn"`` and ``"record"`` the first one is reported and later ones are consequences.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional

from ._compile import first_fault_in_row
from ._errors import NonFiniteError
from ._findings_log import FindingLog, safely
from ._record import StepRecord
from ._record.fault import Fault

if TYPE_CHECKING:
    from ._collect.collector import Collector
    from ._distributed import RankSync
    from .detectors import RunContext
    from .detectors.nonfinite import NonFiniteDiagnosis

__all__ = ["FaultPolicy"]

logger = logging.getLogger("torch_sentinel")


class FaultPolicy:
    """Applies ``on_nonfinite`` to the faults of one sentinel.

    Args:
        on_nonfinite: ``"raise"``, ``"warn"`` or ``"record"``.
        log: where the one ``non_finite`` finding goes.
        rank: this process's rank (None outside torch.distributed).
        owner: passed to each of :attr:`callbacks` with the error (the sentinel).
    """

    def __init__(self, on_nonfinite: str, log: FindingLog, rank: Optional[int], owner: Any) -> None:
        self.on_nonfinite = on_nonfinite
        self._log = log
        self._rank = rank
        self._owner = owner
        #: A NonFiniteError was reported (raised, warned or recorded) at least once.
        self.reported = False
        #: The last step a NonFiniteError was raised for (-1: none yet).
        self.raised_through = -1
        #: NonFiniteErrors raised so far (under "raise", one per faulty step).
        self.raised = 0
        #: Set while ``flush()``, ``report()`` or ``detach()`` bring rows to the host: those are
        #: not training steps, so a fault in them is a consequence, not a new batch.
        self.flushing = False
        #: Called with (error, sentinel) before a NonFiniteError is raised or recorded.
        self.callbacks: list[Callable[[NonFiniteError, Any], None]] = []

    def watching(self, step: int) -> bool:
        """Whether a non-finite value at ``step`` is still reported."""
        if not self.reported:
            return True
        return self.on_nonfinite == "raise" and step > self.raised_through and not self.flushing

    def on_immediate(self, fault: Fault, collector: Collector, context: RunContext, core_width: int,
                     ranks: Optional[RankSync], partial_to_sinks: Callable[[StepRecord], None],
                     diagnosis: NonFiniteDiagnosis, recent: Sequence[StepRecord]) -> None:
        """A hook found ``fault`` mid-step (immediate mode)."""
        # Under "raise" the row of a raised step was abandoned: a fault at the same step number
        # is the next batch, after the loop skipped the bad one.
        if self.reported and self.on_nonfinite != "raise":
            return
        fault = first_fault_in_row(collector, context, core_width, fault)
        if ranks is None and self.on_nonfinite == "raise" and not overflow_only(fault):
            # The error leaves from inside a hook, mid-step: the rows before it and what this
            # step saw up to the fault (the nonfinite/* point at the bad step) reach the sinks
            # first, and the step starts again from clean slots if the loop skips the batch.
            partial_to_sinks(collector.abandon_row())
        self.handle(fault, collector, ranks, diagnosis, recent)

    def handle(self, fault: Fault, collector: Collector, ranks: Optional[RankSync],
               diagnosis: NonFiniteDiagnosis, recent: Sequence[StepRecord]) -> None:
        if ranks is not None:
            # Raising on this rank alone would hang the others in their next collective: hold
            # the evidence; the agreement decides on every rank at the same step.
            ranks.hold(fault)
            collector.immediate = False
            return
        self.decide(fault, self._rank, collector, diagnosis, recent)

    def decide(self, fault: Fault, rank: Optional[int], collector: Collector, diagnosis: NonFiniteDiagnosis,
               recent: Sequence[StepRecord]) -> None:
        """Report ``fault`` (found on ``rank``) as the policy says."""
        if overflow_only(fault):
            # Exact counts of the tensor itself found nothing: every value is finite in its own
            # dtype, so only a statistic of it overflowed. Never a NonFiniteError.
            logger.warning("torch_sentinel: a statistic at step %d (%s, %s) overflowed although the tensor "
                           "is finite; not reported as non-finite", fault.step, fault.boundary, fault.module)
            return
        first = not self.reported
        self.reported = True
        self.raised_through = max(self.raised_through, fault.step)
        policy = self.on_nonfinite
        if policy != "raise":
            collector.immediate = False  # one report per run; later steps are consequences
        err = diagnosis.error(fault, list(recent), rank=rank)
        if first:
            # Logged once (finding, console, incident bundle); raised every time.
            self._log.add([diagnosis.finding(err)], write=True)
            for callback in self.callbacks:
                safely(callback, err, self._owner)
        self.raised += policy == "raise"
        if policy == "raise":
            raise err
        if policy == "warn":
            warnings.warn(str(err), RuntimeWarning, stacklevel=3)


def overflow_only(fault: Fault) -> bool:
    """Exact counts of the offending tensor found no NaN/Inf: only a statistic overflowed."""
    ev = fault.evidence
    return ev.nan == 0 and ev.posinf == 0 and ev.neginf == 0
