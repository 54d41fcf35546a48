"""One comparison of one replica group: fingerprints, one gather, the vote, the bisection.

1. Each rank fingerprints its tensors (device work) and sends, in one collective, a header (the
   checksums of its parameter and optimizer-state layouts, its tensor count and its optimizer
   step count, with the status word of :mod:`.exchange`) and its fingerprint rows (16 bytes a
   tensor in exact mode, 24 in tolerance mode), as many as the last check agreed on.
2. If every rank sent that many rows, they are compared at once. Otherwise (Adam's state
   appeared after the first step, or a rank that skipped the very first step has none yet) a
   second gather sends the rows every rank has: all of them if the state layouts agree, else the
   parameters' only, and the per-parameter state layouts say where the state differs.
3. The first differing tensor (parameters before optimizer state) is voted on and bisected.

Every decision reads gathered data only, so every rank of the group takes the same path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Callable, Optional

import numpy as np
import torch

from ..detectors.replica_divergence import Divergence
from .bisect import narrow
from .exchange import gather_rows
from .fingerprint import Marker
from .plan import ReplicaGroup, Snapshot, Tracked
from .vote import Vote, differing, vote

__all__ = ["Comparison", "Outcome"]


@dataclasses.dataclass
class Outcome:
    """The result of one comparison: the same on every rank of the group."""

    #: Group ranks whose local work failed (the check stops everywhere).
    failed: list[int] = dataclasses.field(default_factory=list)
    #: Names of every differing tensor, parameters first.
    differing: list[str] = dataclasses.field(default_factory=list)
    found: Optional[Divergence] = None
    #: The reference's step count at this check.
    step: int = 0


def _layout_rows(values: Sequence[int]) -> torch.Tensor:
    """Layout checksums as fingerprint rows ``[crc, 0, 0]``, compared exactly."""
    rows = torch.zeros((len(values), 3), dtype=torch.int64)
    rows[:, 0] = torch.tensor(list(values), dtype=torch.int64)
    return rows


class Comparison:
    """Compares one :class:`ReplicaGroup`'s tensors across its ranks.

    Args:
        group: the replica group.
        optimizers: whose state is compared alongside the parameters.
        mode: ``"exact"`` or ``"tolerance"``; rtol: tolerance mode's allowance.
        owner: the module owning a parameter (by name).
    """

    def __init__(self, group: ReplicaGroup, optimizers: Sequence[torch.optim.Optimizer], mode: str,
                 rtol: float, owner: Callable[[str], Optional[str]]) -> None:
        self.group = group
        self.optimizers = optimizers
        self.mode = mode
        self.rtol = rtol
        self.owner = owner
        self.marker = Marker(scale=mode == "tolerance")
        #: Rows every rank sends with its header: the count the last check agreed on (a rank
        #: whose count differs sends zeros, and its header makes every rank gather again).
        self._expected = len(group.params)

    def _gather(self, compute: Callable[[], torch.Tensor], shape: tuple[int, ...], what: str) -> np.ndarray:
        g = self.group
        got = gather_rows(compute, shape, g.group, g.size, g.device, what)
        if got.failed:
            raise _Failed(got.failed)
        return got.rows

    def run(self, step: int, skip: Callable[[str], bool] = lambda name: False,
            last_agreeing: Optional[int] = None) -> Outcome:
        """Compare now (a collective on the group). ``step``: this rank's optimizer steps so far;
        ``skip(name)``: whether a differing tensor was reported already (the next one is taken).
        """
        try:
            return self._run(step, skip, last_agreeing)
        except _Failed as failed:
            return Outcome(failed=failed.ranks)
        finally:
            self.marker.release()

    def _run(self, step: int, skip: Callable[[str], bool], last_agreeing: Optional[int]) -> Outcome:
        g = self.group
        mine: dict[str, object] = {}
        expected = self._expected

        def payload() -> torch.Tensor:
            snap = g.snapshot(self.optimizers)
            rows = self.marker.rows(snap.tensors, g.device)
            mine["snap"], mine["rows"] = snap, rows
            head = torch.tensor([snap.param_layout, snap.state_layout, len(snap.tensors), step], device=g.device)
            if rows.shape[0] != expected:  # this rank's tensors changed: the header says so
                rows = torch.zeros((expected, 3), dtype=torch.int64, device=g.device)
            return torch.cat([head, rows.reshape(-1)])

        got = self._gather(payload, (4 + 3 * expected,), "fingerprints")
        heads = got[:, :4]
        snap, rows = mine["snap"], mine["rows"]
        assert isinstance(snap, Snapshot) and isinstance(rows, torch.Tensor)
        steps = {g.ranks[i]: int(heads[i, 3]) for i in range(g.size)}
        outcome = Outcome(step=int(heads[0, 3]))
        if (heads[:, 0] != heads[0, 0]).any():
            # Parameters of other shapes or dtypes: nothing can be compared (DDP would have
            # refused this model; an unwrapped one may get here).
            layout = self._gather(lambda: _layout_rows([snap.param_layout]), (1, 3), "layouts")
            outcome.differing = ["(parameter shapes and dtypes)"]
            outcome.found = self._divergence(vote(layout, 0, "exact", 0.0), Tracked("(parameters)"),
                                             steps, last_agreeing, outcome.differing, what="layout")
            outcome.step = steps[outcome.found.reference[0]]
            return outcome
        layouts_agree = bool((heads[:, 1] == heads[0, 1]).all())
        n = len(snap.tensors) if layouts_agree else snap.params
        if (heads[:, 2] == expected).all():
            gathered = got[:, 4:].reshape(g.size, expected, 3)[:, :n]  # one gather did it all
        else:  # some rank's tensors changed (Adam's state appeared after the first step)
            gathered = self._gather(lambda: rows[:n], (n, 3), "fingerprints")
        self._expected = n
        diff = [int(i) for i in differing(gathered, self.mode, self.rtol)]
        names = [snap.tracked[i].name for i in diff]
        state_diff: list[int] = []
        state_rows = None
        if not layouts_agree:
            state_rows = self._gather(lambda: _layout_rows(snap.state_layouts), (snap.params, 3), "layouts")
            state_diff = [int(i) for i in differing(state_rows, "exact", 0.0)]
            names += [f"{snap.tracked[i].parameter}:(state layout)" for i in state_diff]
        outcome.differing = names
        if not names:
            return outcome
        for k, i in enumerate(diff):
            if not skip(names[k]):
                v = vote(gathered, i, self.mode, self.rtol)
                chunk, numel = narrow(self.marker, snap.tensors[i], g, v.diverged[0], v.reference[0], self.mode)
                outcome.found = self._divergence(v, snap.tracked[i], steps, last_agreeing, names,
                                                 chunk=chunk, numel=numel)
                break
        else:
            for k, i in enumerate(state_diff):
                if state_rows is not None and not skip(names[len(diff) + k]):
                    v = vote(state_rows, i, "exact", 0.0)
                    outcome.found = self._divergence(v, Tracked(snap.tracked[i].parameter), steps,
                                                     last_agreeing, names, what="layout")
                    break
        if outcome.found is not None:
            outcome.step = steps[outcome.found.reference[0]]
        return outcome

    def _divergence(self, v: Vote, tracked: Tracked, steps: dict[int, int],
                    last_agreeing: Optional[int], names: list[str], *, what: str = "values",
                    chunk: Optional[tuple[int, int]] = None, numel: int = 0) -> Divergence:
        ranks = self.group.ranks
        reference = tuple(ranks[r] for r in v.reference)
        this = tracked.name if what == "values" else f"{tracked.parameter}:(state layout)"
        others = tuple(n for n in names if n != this)[:8]
        return Divergence(
            parameter=tracked.parameter, state=tracked.state, module=self.owner(tracked.parameter),
            ranks=tuple(ranks[r] for r in v.diverged), reference=reference, majority=v.majority,
            mode=self.mode, first_seen_step=steps[reference[0]], last_agreeing_step=last_agreeing,
            numel=numel, chunk=chunk, what=what, differing=len(names), others=others,
            steps=steps if len(set(steps.values())) > 1 else {},
            deviation=v.deviation, rtol=self.rtol if self.mode == "tolerance" else None)


class _Failed(Exception):
    """Some rank's local work failed: every rank stops this comparison."""

    def __init__(self, ranks: list[int]) -> None:
        super().__init__(ranks)
        self.ranks = ranks
