"""The replica check as a probe: when it runs, and what happens when replicas differ.

**When.** At the start of every ``replica_check_every``-th training forward of the model as
passed to ``attach()`` (the DDP wrapper itself), before DDP or FSDP do anything in that
forward, and at the first one. Not at the end of ``optimizer.step()``: a rank that skips a
step never reaches that point, and a collective there would then meet the others' next one
(gloo aborts the job on the size mismatch). Under DDP every rank runs the same number of
training forwards, or DDP itself hangs, so this point is reached in lockstep even then. The
weights compared are those the coming forward uses: those left by the last update.

**Cost.** Between checks: a counter. At a check: device work over every compared tensor (one
read of each), two small collectives, and the host reads of their results (cold path, by
design: on accelerators each waits for the device).

**Verdict.** The same on every rank (see ``vote.py``). ``on_divergence="raise"`` raises
:class:`~torch_sentinel.ReplicaDivergenceError` on every rank, from this hook, before the
forward starts: no rank is left waiting in a collective. ``"warn"`` records the finding,
warns once per differing tensor, and goes on. When the check cannot run on some rank (its
local work raised), every rank learns it from the gathered status and switches it off, with
one warning.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch import nn

from .._collect.compat import is_compiling
from .._collect.hookset import ModuleHook
from .._collect.probe import Probe, ProbeHost
from .._errors import SentinelError
from .._findings import Finding
from ..detectors.replica_divergence import Divergence, ReplicaDivergenceDetector, message
from .compare import Comparison, Outcome
from .exchange import agree_world
from .plan import Plan, build_plan, gather_device

__all__ = ["ReplicaCheck"]

logger = logging.getLogger("torch_sentinel")


class ReplicaCheck(Probe):
    """Compares data-parallel replicas every ``plan.every`` training forwards.

    Args:
        model: the module passed to ``attach()`` (its forward pre-hook is the check point).
        plan: what to compare (``plan.py``).
        detector: turns a divergence into the finding and the error.
        mode: ``"exact"`` or ``"tolerance"``; policy: ``"raise"`` or ``"warn"``.
        record: adds a finding to the sentinel's findings and sinks.
    """

    name = "replica check"

    def __init__(self, model: nn.Module, plan: Plan, detector: ReplicaDivergenceDetector, mode: str,
                 policy: str, record: Callable[[Finding], None]) -> None:
        #: Held until setup hooks it (then the model's hook holds this check, not the reverse).
        self._model: Optional[nn.Module] = model
        self.plan = plan
        self.every = plan.every
        self.mode = mode
        self.policy = policy
        self._detector = detector
        self._record = record
        self._host: Optional[ProbeHost] = None
        self._comparisons: list[Comparison] = []
        self._forwards = 0
        self._reported: set[str] = set()
        #: The step of the last check at which every replica agreed.
        self.last_agreeing: Optional[int] = None
        #: Checks run so far; False once switched off.
        self.checks = 0
        self.on = True

    @classmethod
    def maybe(cls, model: nn.Module, host: Any, options: Any, detectors: Sequence[Any],
              record: Callable[[Finding], None]) -> Optional[ReplicaCheck]:
        """A check added to ``host`` (the collector), or None: no process group, nothing
        replicated, ``replica_check_every=0`` or ``disable={"replica_divergence"}``."""
        detector = next((d for d in detectors if isinstance(d, ReplicaDivergenceDetector)), None)
        if detector is None:
            return None
        plan = build_plan(model, host.map.root, options.replica_check_every)
        if plan is None:
            return None
        detector.sharded = plan.sharded  # said once, as an info finding, at attach
        if not plan.groups:
            return None
        check = cls(model, plan, detector, options.replica_check, options.on_divergence, record)
        host.add_probe(check)
        return check

    def setup(self, host: ProbeHost) -> None:
        self._host = host
        owner = host.map.param_owner
        self._comparisons = [
            Comparison(g, host.optimizers, self.mode, self._detector.rtol,
                       lambda p: owner.get(p, p.rpartition(".")[0]) or None)
            for g in self.plan.groups
        ]
        model, self._model = self._model, None
        assert model is not None, "a ReplicaCheck is set up once"
        # First of the forward pre-hooks: before DDP's or FSDP's own work in that forward.
        host.hooks.add(model.register_forward_pre_hook(ModuleHook(self._before_forward), prepend=True))

    def close(self) -> None:
        self._comparisons = []
        self._host = None

    # ------------------------------------------------------------------ hot path
    def _before_forward(self, module: nn.Module, args: Any) -> None:
        if not self.on or not torch.is_grad_enabled() or is_compiling():
            return None
        due = self._forwards % self.every == 0
        self._forwards += 1
        if due:
            self.run()
        return None

    # ------------------------------------------------------------------ cold path
    def run(self) -> None:
        """One check now: a collective over the replica groups (every rank must call it)."""
        host = self._host
        if host is None:
            return
        self.checks += 1
        skip = self._reported.__contains__ if self.policy == "warn" else (lambda name: False)
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
        self._act(found)

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

    def _act(self, d: Divergence) -> None:
        self._reported.add(d.tensor if d.what == "values" else f"{d.parameter}:(state layout)")
        self._record(self._detector.divergence_finding(d))
        if self.policy == "raise":
            raise self._detector.error(d)
        warnings.warn(message(d), RuntimeWarning, stacklevel=4)

    def _switch_off(self, where: str, why: str) -> None:
        self.on = False
        rank = dist.get_rank() if dist.is_initialized() else 0
        logger.warning("torch_sentinel: the replica check is switched off on %s (rank %d speaking): "
                       "%s; replicas are no longer compared", where, rank, why)
