"""Overhead: what watching every format adds to a training step, and the host reads it makes.

Three copies of one benchmark model (``benchmarks/models.py``: same initial weights, same
batches) train side by side: the bare loop, the sentinel with ``precision=()`` and the same
sentinel watching all four formats (the device work is the same for any number of formats;
the host's grows with them). They step in turn, one step each, the order rotating every step,
so a burst of machine noise hits all three alike. Reported per phase (the first 100 steps,
where the sentinel samples densely, and the steady state after them, at the default sampling
of one step in 50): the total-time ratios, and the median extra time of a step that takes
histograms (steps 3-9, sampled for the other probes, take only each tensor's amax).
"""

from __future__ import annotations

import statistics
import time
import warnings
from typing import Any, Callable, Optional

import torch

import torch_sentinel
from benchmarks import models as bench_models
from torch_sentinel._collect.cadence import sampled
from torch_sentinel.precision.probe import histogram_step
from torch_sentinel.testing import count_host_syncs

__all__ = ["host_reads", "run"]

ALL = ("bf16", "fp16", "e4m3", "e5m2")
VARIANTS: dict[str, Optional[tuple[str, ...]]] = {"bare": None, "sentinel": (), "sentinel+precision": ALL}


class _Copy:
    def __init__(self, model_name: str, precision: Optional[tuple[str, ...]], tiny: bool, check: str = "auto") -> None:
        self.work = bench_models.build(model_name, torch.device("cpu"), tiny)
        self.opt = torch.optim.AdamW(self.work.model.parameters(), lr=1e-4)
        self.sentinel = None
        if precision is not None:
            self.sentinel = torch_sentinel.attach(self.work.model, self.opt, check=check, precision=precision)
        self.steps = 0

    def step(self) -> None:
        x, y = self.work.batch(self.steps)
        self.opt.zero_grad(set_to_none=True)
        self.work.loss_fn(self.work.model(x), y).backward()
        self.opt.step()
        self.steps += 1

    def close(self) -> None:
        if self.sentinel is not None:
            self.sentinel.detach()


def _timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(model_name: str, first: int = 100, steady: int = 150, tiny: bool = False) -> dict[str, Any]:
    """Per-step times of the three variants, interleaved, over ``first + steady`` steps."""
    names = list(VARIANTS)
    times: dict[str, list[float]] = {n: [] for n in names}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        copies = {n: _Copy(model_name, p, tiny) for n, p in VARIANTS.items()}
        try:
            for i in range(first + steady):
                order = names[i % 3:] + names[: i % 3]
                for n in order:
                    times[n].append(_timed(copies[n].step))
        finally:
            for c in copies.values():
                c.close()
    out: dict[str, Any] = {"model": copies["bare"].work.description, "steps": first + steady}
    for phase, lo, hi in (("first", 0, first), ("steady", first, first + steady)):
        total = {n: sum(times[n][lo:hi]) for n in names}
        sampled_steps = [i for i in range(lo, hi) if sampled(i)]
        histogram_steps = [i for i in sampled_steps if histogram_step(i)]
        extra = [times["sentinel+precision"][i] - times["sentinel"][i] for i in histogram_steps]
        out[phase] = {
            "steps": hi - lo,
            "sampled_steps": len(sampled_steps),
            "histogram_steps": len(histogram_steps),
            "bare_ms": statistics.median(times["bare"][lo:hi]) * 1e3,
            "precision_vs_sentinel": total["sentinel+precision"] / total["sentinel"],
            "sentinel_vs_bare": total["sentinel"] / total["bare"],
            "precision_vs_bare": total["sentinel+precision"] / total["bare"],
            "sampled_step_extra_ms": statistics.median(extra) * 1e3 if extra else None,
        }
    return out


def host_reads(model_name: str, tiny: bool = False) -> dict[str, Any]:
    """Device-to-host reads over steps 0-11 (sampled and not) and 100-101, without a flush,
    for each variant, in both check modes (the bare loop's own: AdamW reads its step count)."""
    out: dict[str, Any] = {}
    for check in ("immediate", "deferred"):
        counts = {}
        for name in VARIANTS:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                copy = _Copy(model_name, VARIANTS[name], tiny, check=check)
                if copy.sentinel is not None:
                    copy.sentinel.options.flush_every = 10**6  # no detector window inside the count
                reads = 0
                for i in range(102):
                    if i < 12 or i >= 100:
                        with count_host_syncs() as c:
                            copy.step()
                        reads += c.count
                    else:
                        copy.step()
                copy.close()
            counts[name] = reads
        out[check] = {**counts, "added": counts["sentinel+precision"] - counts["sentinel"]}
    return out
