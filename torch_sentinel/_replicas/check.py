"""The replica check as a lockstep follower: when it runs, and what happens when replicas differ.

**When.** At training forwards of the model as passed to ``attach()`` (``_lockstep.py``: a point
every rank reaches the same number of times, before DDP or FSDP do anything in that forward): at
the first one, then at the first one after some rank closed ``replica_check_every`` more rows
(optimizer steps) since the last check. The row counts come from the non-finite agreement's
collective (``_distributed.RankSync``), so every rank reads the same number at the same forward
and decides alike: with gradient accumulation a check still comes every ~``every`` optimizer
steps, and a rank that skipped a ``step()`` does not shift the schedule. Without that collective
(``sync_ranks=False``) the check counts training forwards instead. The weights compared are those
the coming forward uses: those left by the last update. ``report(all_ranks=True)`` (the default
under ``torch.distributed``, a collective) runs one last check when rows were closed since the
last one; ``detach()`` does not (it is not a collective).

**Cost.** Between checks: a counter. At a check: device work over every compared tensor (one
read of each), two small collectives, and the host reads of their results (cold path, by
design: on accelerators each waits for the device).

**Verdict.** The same on every rank (see ``vote.py``). ``on_divergence="raise"`` raises
:class:`~torch_sentinel.ReplicaDivergenceError` on every rank, from the forward pre-hook, before
the forward starts: no rank is left waiting in a collective. ``"warn"`` records the finding,
warns once per differing tensor, and goes on. The last check, at ``report()``, records and warns
under both (the report holds the finding). When the check cannot run on some rank (its local
work raised), every rank learns it from the gathered status and switches it off, with one
warning.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from typing import Any, Callable, Optional

import torch.distributed as dist
from torch import nn

from .._collect.probe import Probe, ProbeHost
from .._distributed import RankSync
from .._errors import SentinelError
from .._findings import Finding
from .._lockstep import Follower, Lockstep
from ..detectors.replica_divergence import Divergence, ReplicaDivergenceDetector, message
from .compare import Comparison, Outcome
from .exchange import agree_world
from .plan import Plan, build_plan, gather_device

__all__ = ["ReplicaCheck"]

logger = logging.getLogger("torch_sentinel")


class ReplicaCheck(Probe, Follower):
    """Compares data-parallel replicas every ``plan.every`` optimizer steps, at lockstep forwards.

    Args:
        plan: what to compare (``plan.py``).
        detector: turns a divergence into the finding and the error.
        mode: ``"exact"`` or ``"tolerance"``; policy: ``"raise"`` or ``"warn"``.
        record: adds a finding to the sentinel's findings and sinks.
        ranks: the non-finite agreement, whose collective also agrees on the rows closed (None:
            ``sync_ranks=False``; the check then counts training forwards).
    """

    name = "replica check"

    def __init__(self, plan: Plan, detector: ReplicaDivergenceDetector, mode: str, policy: str,
                 record: Callable[[Finding], None], ranks: Optional[RankSync] = None) -> None:
        self.plan = plan
        self.every = plan.every
        self.mode = mode
        self.policy = policy
        self._detector = detector
        self._record = record
        self._ranks = ranks
        self._host: Optional[ProbeHost] = None
        self._comparisons: list[Comparison] = []
        self._forwards = 0
        #: The agreed rows (or, without them, the training forwards) at the last check.
        self._counted_at_check: Optional[int] = None
        self._reported: set[str] = set()
        #: The step of the last check at which every replica agreed.
        self.last_agreeing: Optional[int] = None
        #: Checks run so far; False once switched off.
        self.checks = 0
        self.on = True

    @classmethod
    def maybe(cls, model: nn.Module, lockstep: Optional[Lockstep], host: Any, options: Any,
              detectors: Sequence[Any], record: Callable[[Finding], None],
              ranks: Optional[RankSync] = None) -> Optional[ReplicaCheck]:
        """A check following ``lockstep``, added to ``host`` (the collector), or None: no process
        group, nothing replicated, ``replica_check_every=0`` or ``disable={"replica_divergence"}``."""
        detector = next((d for d in detectors if isinstance(d, ReplicaDivergenceDetector)), None)
        if detector is None or lockstep is None:
            return None
        plan = build_plan(model, host.map.root, options.replica_check_every)
        if plan is None:
            return None
        detector.sharded = plan.sharded  # said once, as an info finding, at attach
        if not plan.groups:
            return None
        check = cls(plan, detector, options.replica_check, options.on_divergence, record, ranks)
        host.add_probe(check)
        lockstep.follow(check)
        return check

    def setup(self, host: ProbeHost) -> None:
        self._host = host
        owner = host.map.param_owner
        self._comparisons = [
            Comparison(g, host.optimizers, self.mode, self._detector.rtol,
                       lambda p: owner.get(p, p.rpartition(".")[0]) or None)
            for g in self.plan.groups
        ]

    def close(self) -> None:
        self._comparisons = []
        self._host = None

    # ------------------------------------------------------------------ hot path
    def _count(self) -> int:
        """What the cadence counts, the same on every rank: the most rows any rank closed, as
        agreed (or the training forwards, without the agreement)."""
        return max(self._ranks.rows_agreed, 0) if self._ranks is not None else self._forwards

    def at_forward(self) -> None:
        self._forwards += 1
        if not self.on:
            return
        count = self._count()
        last = self._counted_at_check
        if last is None or count >= last + self.every:
            self._counted_at_check = count
            self.run()

    def at_report(self) -> None:
        """``report()`` on every rank: one last check if some rank closed a row since the last
        one (without the agreement: if a training forward ran since), recorded, never raised."""
        last = self._counted_at_check
        if self.on and last is not None and self._count() > last:
            self._counted_at_check = self._count()
            self.run(final=True)

    # ------------------------------------------------------------------ cold path
    def run(self, final: bool = False) -> None:
        """One check now: a collective over the replica groups (every rank must call it).
        ``final``: from ``report()``; a divergence is recorded and warned about, not raised."""
        host = self._host
        if host is None:
            return
        self.checks += 1
        reported = self.policy == "warn" or final
        skip = self._reported.__contains__ if reported else (lambda name: False)
        try:
            outcomes = [c.run(host.step, skip, self.last_agreeing) for c in self._comparisons]
            failed, found = self._agree(outcomes)
        except SentinelError:
            raise
        except Exception as exc:  # a collective itself failed: the process group is broken
            self._switch_off("this rank", f"a collective failed ({type(exc).__name__}: {exc})")
            return
        if failed:
            self._switch_off("every rank", f"rank(s) {', '.join(map(str, failed))} could not compute "
                             "their part (their log says why)")
            return
        if found is None:
            if all(not o.differing for o in outcomes):
                self.last_agreeing = outcomes[0].step if outcomes else host.step
            return
        self._act(found, final)

    def _agree(self, outcomes: list[Outcome]) -> tuple[list[int], Optional[Divergence]]:
        """Failed global ranks and the divergence to report, the same on every rank of the
        world (replica groups that are not the whole world share their findings first)."""
        failed = sorted({c.group.ranks[r] for c, o in zip(self._comparisons, outcomes) for r in o.failed})
        found = next((o.found for o in outcomes if o.found is not None), None)
        if not self.plan.partial_groups:
            return failed, found
        code = 2 if failed else (1 if found is not None else 0)
        payload = {"failed": failed, "found": found.to_dict() if found else None} if code else None
        shared = agree_world(code, payload, gather_device(None, None))
        failed = sorted({r for p in shared for r in p["failed"]})
        first = next((p["found"] for p in shared if p["found"]), None)
        return failed, Divergence.from_dict(first) if first else None

    def _act(self, d: Divergence, final: bool) -> None:
        self._reported.add(d.tensor if d.what == "values" else f"{d.parameter}:(state layout)")
        self._record(self._detector.divergence_finding(d))
        if self.policy == "raise" and not final:
            raise self._detector.error(d)
        warnings.warn(message(d), RuntimeWarning, stacklevel=5)

    def _switch_off(self, where: str, why: str) -> None:
        self.on = False
        rank = dist.get_rank() if dist.is_initialized() else 0
        logger.warning("torch_sentinel: the replica check is switched off on %s (rank %d speaking): "
                       "%s; replicas are no longer compared", where, rank, why)
