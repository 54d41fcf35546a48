"""Run a short training twice from the same seed and say where the runs first part ways."""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Optional

import torch

from .seed import seed_everything

__all__ = ["DeterminismReport", "check_determinism"]


@dataclasses.dataclass
class DeterminismReport:
    """``ok`` when every run matched the first; otherwise the first step and tensor that
    differed, and by how much."""

    runs: int
    steps: int
    step: Optional[int] = None
    name: Optional[str] = None
    max_abs_diff: Optional[float] = None
    run: Optional[int] = None
    detail: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.step is None and self.detail is None

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        if self.ok:
            return f"deterministic: {self.runs} runs agree on all {self.steps} steps"
        where = f"step {self.step}, {self.name!r}" if self.step is not None else "the run's output"
        diff = f" (max |a - b| = {self.max_abs_diff:.3g})" if self.max_abs_diff is not None else ""
        return (f"runs diverge at {where}{diff}: run {self.run} differs from run 0"
                + (f"; {self.detail}" if self.detail else "")
                + ". Check torch.use_deterministic_algorithms, cuDNN benchmark, DataLoader "
                  "workers' seeding, and any randomness not drawn from the seeded generators.")


def _items(value: Any, prefix: str) -> list[tuple[str, Any]]:
    """Named leaves of one step's output: a tensor, a number, or a mapping of them."""
    if isinstance(value, Mapping):
        out = []
        for k, v in value.items():
            out.extend(_items(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        out = []
        for i, v in enumerate(value):
            out.extend(_items(v, f"{prefix}[{i}]"))
        return out
    return [(prefix or "value", value)]


def _steps(out: Any) -> list[Any]:
    if isinstance(out, Mapping):
        # {name: per-step sequence} -> per-step {name: value}
        series = {k: list(v) for k, v in out.items()}
        n = max((len(v) for v in series.values()), default=0)
        return [{k: v[i] for k, v in series.items() if i < len(v)} for i in range(n)]
    if isinstance(out, torch.Tensor):
        return list(out.unbind(0)) if out.dim() else [out]
    if isinstance(out, Sequence):
        return list(out)
    raise TypeError(
        "check_determinism(): train_fn must return per-step values: a list (of tensors, numbers "
        f"or dicts of them) or a dict of per-step lists; got {type(out).__name__}"
    )


def _compare(a: Any, b: Any) -> tuple[bool, Optional[float]]:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
            return False, None
        ta, tb = a.detach().cpu(), b.detach().cpu()
        if torch.equal(ta, tb):
            return True, 0.0
        if ta.is_floating_point() and torch.equal(ta.isnan(), tb.isnan()):
            both = ~ta.isnan()
            if torch.equal(ta[both], tb[both]):
                return True, 0.0
        diff = (ta.double() - tb.double()).abs()
        return False, float(diff.nan_to_num(nan=math.inf).max()) if diff.numel() else None
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True, 0.0
    if a == b:
        return True, 0.0
    try:
        return False, abs(float(a) - float(b))
    except (TypeError, ValueError):
        return False, None


def check_determinism(train_fn: Callable[..., Any], runs: int = 2, *, seed: int = 0,
                      deterministic: bool = False) -> DeterminismReport:
    """Call ``train_fn`` ``runs`` times, each after ``seed_everything(seed)``, and compare.

    ``train_fn()`` (or ``train_fn(seed)`` if it takes an argument) returns per-step values:
    a list of losses, of tensors, or of dicts such as ``{"loss": loss, **model.state_dict()}``;
    or a dict of per-step lists. Values are compared exactly (bitwise for tensors; NaN equals
    NaN). The report names the first step and value where a run differs from the first.
    """
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 2:
        raise ValueError(f"check_determinism() needs runs >= 2, got {runs!r}")
    try:
        takes_seed = len(inspect.signature(train_fn).parameters) >= 1
    except (TypeError, ValueError):
        takes_seed = False
    results = []
    for _ in range(runs):
        seed_everything(seed, deterministic=deterministic, warn=False)
        out = train_fn(seed) if takes_seed else train_fn()
        results.append(_steps(out))
    first = results[0]
    for r, other in enumerate(results[1:], start=1):
        for step, (sa, sb) in enumerate(zip(first, other)):
            ia, ib = dict(_items(sa, "")), dict(_items(sb, ""))
            for name in ia:
                if name not in ib:
                    return DeterminismReport(runs, len(first), step, name, None, r, "missing in this run")
                same, diff = _compare(ia[name], ib[name])
                if not same:
                    return DeterminismReport(runs, len(first), step, name, diff, r)
        if len(first) != len(other):
            return DeterminismReport(runs, len(first), None, None, None, r,
                                     f"run 0 returned {len(first)} steps, run {r} {len(other)}")
    return DeterminismReport(runs, len(first))
