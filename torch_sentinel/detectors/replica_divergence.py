"""``replica_divergence``: data-parallel replicas that should be bit-identical are not.

The device side (fingerprints, majority vote, bisection, collectives) lives in
``torch_sentinel/_replicas``; it hands this detector a :class:`Divergence` of plain numbers,
the same on every rank, and the detector turns it into the finding and the error. This
detector reads no step records: the verdict is reached at a check step on every rank at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Optional

from .._errors import ReplicaDivergenceError, format_message
from .._findings import Finding
from .base import Detector, Threshold

__all__ = ["Divergence", "ReplicaDivergenceDetector"]


@dataclasses.dataclass(frozen=True)
class Divergence:
    """What a replica check found, in plain numbers (ranks are global ranks)."""

    parameter: str
    state: Optional[str]
    module: Optional[str]
    ranks: tuple[int, ...]
    reference: tuple[int, ...]
    #: Whether the reference ranks are more than half of the group.
    majority: bool
    mode: str
    first_seen_step: int
    last_agreeing_step: Optional[int]
    numel: int = 0
    #: ``(start, end)`` in the flattened local tensor, holding a differing element.
    chunk: Optional[tuple[int, int]] = None
    #: "values", or "layout" when the optimizer state holds other tensors on those ranks.
    what: str = "values"
    #: How many tensors differ in all, and the names of a few others.
    differing: int = 1
    others: tuple[str, ...] = ()
    #: Optimizer steps completed per rank, when the ranks do not agree on it.
    steps: dict[int, int] = dataclasses.field(default_factory=dict)
    #: Tolerance mode: how far the projection moved, relative to the tensor's norm.
    deviation: Optional[float] = None
    rtol: Optional[float] = None

    @property
    def tensor(self) -> str:
        return self.parameter if self.state is None else f"{self.parameter}:{self.state}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Divergence:
        data = dict(data)
        for key in ("ranks", "reference", "others"):
            data[key] = tuple(data[key])
        if data.get("chunk") is not None:
            data["chunk"] = tuple(data["chunk"])
        data["steps"] = {int(k): int(v) for k, v in data.get("steps", {}).items()}
        return cls(**data)


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def _what(d: Divergence) -> str:
    if d.what == "layout":
        return f"set of optimizer state tensors for {d.parameter}"
    if d.state is None:
        return d.parameter
    return f"optimizer state {d.state!r} of {d.parameter}"


def _next_check(d: Divergence) -> str:
    diverged = _ranks(d.ranks)
    if d.steps and len(set(d.steps.values())) > 1:
        counts = sorted(set(d.steps.values()))
        fewer = [r for r, n in sorted(d.steps.items()) if n == counts[0]]
        more = [r for r, n in sorted(d.steps.items()) if n == counts[-1]]
        return (f"{_ranks(fewer)} completed {counts[0]} optimizer steps, {_ranks(more)} completed "
                f"{counts[-1]}: a skipped optimizer.step() (a rank-dependent condition around the "
                "step, an exception caught on one rank, or a GradScaler that skipped there)")
    return (f"check, in order: the hardware of {diverged} (silent data corruption: run a memory and "
            f"compute test on its device); a skipped optimizer.step() on {diverged}; unused "
            "parameters (no gradient, so DDP never syncs them: code that changes them on one rank); "
            "a hook, callback or checkpoint load that edits weights on one rank only")


def message(d: Divergence) -> str:
    """The error message: what differs, where, and what to check next."""
    what = _what(d)
    headline = (f"replicas differ at step {d.first_seen_step}: {_ranks(d.ranks)} "
                f"{'holds' if len(d.ranks) == 1 else 'hold'} another {what} than {_ranks(d.reference)}")
    if d.mode == "exact":
        expected = f"the same {what}, bit for bit, on every data-parallel replica (replica_check='exact')"
    else:
        expected = (f"{what} within {d.rtol:g} of its norm on every replica "
                    "(replica_check='tolerance')")
    if d.what == "layout":
        arrived = f"the optimizer state of {d.parameter} holds other tensors (names, shapes or dtypes) there"
    else:
        arrived = f"{d.numel} elements differ somewhere"
        if d.chunk is not None:
            arrived = f"elements [{d.chunk[0]}, {d.chunk[1]}) of {d.numel} (flattened) hold a difference"
        if d.deviation is not None:
            arrived += f"; its +-1 projection moved by {d.deviation:.3g} of its norm"
    if d.differing > 1:
        arrived += f"; {d.differing} tensors differ in all ({', '.join(d.others)}"
        arrived += ", ...)" if d.differing - 1 > len(d.others) else ")"
    if not d.majority:
        arrived += (f"; no majority: the ranks split, and {_ranks(d.reference)} "
                    "were taken as the reference, so the fault may be on either side")
    since = ("the first check" if d.last_agreeing_step is None
             else f"the last check that agreed was at the start of step {d.last_agreeing_step}")
    where = f"module {d.module or '(root)'}, parameter {d.parameter}"
    if d.state is not None:
        where += f", optimizer state {d.state!r}"
    where += f"; first seen at the start of step {d.first_seen_step}; {since}"
    return format_message(headline, expected=expected, arrived=arrived, where=where,
                          next_check=_next_check(d))


class ReplicaDivergenceDetector(Detector):
    """The host half of the replica check: reads no records; the probe in ``_replicas/`` hands
    it each :class:`Divergence`, the same on every rank, at the check step."""

    kind = "replica_divergence"
    rung = "updates"
    next_check = "inspect_the_diverged_rank"
    hypothesis = "one rank's weights left the others' (faulty hardware, a skipped step, a rank-local edit)"
    thresholds: ClassVar[Mapping[str, Threshold]] = {
        "rtol": Threshold(1e-5, "tolerance mode's allowance, relative to the tensor's norm: 100x the "
                          "projection noise of independent 1e-7 relative noise per element (the worst "
                          "of 10,000 noisy steps was 4.9e-7: tests/replicas/test_tolerance_noise.py)"),
    }

    def __init__(self) -> None:
        self.rtol = self.thresholds["rtol"].default
        #: Parameters skipped because they are sharded along every mesh dimension (set by the
        #: replica check at attach, before the first conclude).
        self.sharded: list[str] = []
        self._said_sharded = False

    def setup(self) -> None:
        self.rtol = self.threshold("rtol")

    def conclude(self, final: bool = False) -> Iterable[Finding]:
        if not self.sharded or self._said_sharded:
            return ()
        self._said_sharded = True
        n = len(self.sharded)
        return (self.finding(
            f"{n} parameter(s) are sharded along every mesh dimension (FSDP): no rank holds a "
            "replica of them, so the replica check skips them",
            severity="info", evidence={"skipped": self.sharded[:10], "count": n}),)

    def divergence_finding(self, d: Divergence) -> Finding:
        return self.finding(
            message(d).splitlines()[0], module=d.module, step=d.first_seen_step, severity="error",
            rank=d.ranks[0], evidence=evidence(d))

    def error(self, d: Divergence) -> ReplicaDivergenceError:
        return ReplicaDivergenceError(
            message(d), step=d.first_seen_step, rank=d.ranks[0], ranks=d.ranks, module=d.module,
            parameter=d.parameter, state=d.state, chunk=d.chunk, evidence=evidence(d))


def evidence(d: Divergence) -> dict[str, Any]:
    """The finding's evidence: ``parameter``, ``ranks``, ``chunk``, ``first_seen_step``,
    ``last_agreeing_step``, ``mode`` and the figures behind them."""
    out: dict[str, Any] = {
        "parameter": d.parameter,
        "ranks": list(d.ranks),
        "chunk": list(d.chunk) if d.chunk is not None else None,
        "first_seen_step": d.first_seen_step,
        "last_agreeing_step": d.last_agreeing_step,
        "mode": d.mode,
        "reference_ranks": list(d.reference),
        "majority": d.majority,
        "numel": d.numel,
        "differing": d.differing,
        "others": list(d.others),
        "what": d.what,
    }
    if d.state is not None:
        out["state"] = d.state
    if d.steps:
        out["steps"] = {str(r): n for r, n in sorted(d.steps.items())}
    if d.deviation is not None:
        out["deviation"] = d.deviation
        out["rtol"] = d.rtol
    return out
