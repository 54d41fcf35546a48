"""The per-forward collective of the cross-rank agreement (``torch_sentinel/_distributed.py``).

Under ``torch.distributed`` every training forward of the attached model is a lockstep point:
each rank reduces what it recorded since the previous one to two integers on the device and
joins one ``all_reduce(MIN)`` of 16 bytes. With gradient accumulation of *k* micro-batches a
step has *k* points, and the row still open is reduced at each but the first. Measured two
ways, on the same ranks:

1. the collective alone: ``all_reduce`` of a 16-byte tensor, median of many calls;
2. in situ: training steps of *k* = 4 micro-batches (``no_sync`` for all but the last) of two
   DDP copies of the tiny variant of the benchmark model (the same module structure, so about
   the same row), one attached with ``sync_ranks=True``, one with ``sync_ranks=False`` (replica
   check off in both), alternating; the cost of a point is the difference of their medians
   divided by *k*. Between DDP's own all-reduces the ranks drift apart; each point makes the
   faster rank wait for the slower one there, and on a loaded machine a rank blocked in a
   collective is rescheduled late: that wait is part of what is measured.
"""

from __future__ import annotations

import contextlib
import statistics
from typing import Any, Callable

import torch
import torch.distributed as dist

from .. import models as bench_models

__all__ = ["MICRO", "agreement"]

#: Micro-batches per optimizer step in the in-situ measurement.
MICRO = 4


def _median_ms(times: list[float]) -> float:
    return 1e3 * statistics.median(times)


def agreement(model_name: str, device: torch.device, clock: Any, steps: int) -> dict[str, Any]:
    """Cost of one agreement point, alone and in situ (every rank calls this)."""
    import torch_sentinel

    payload = torch.zeros(2, dtype=torch.int64, device=device)
    alone = [clock.time(lambda: dist.all_reduce(payload, op=dist.ReduceOp.MIN)) for _ in range(4 * steps)]

    ids = [device.index] if device.type == "cuda" else None
    copies: dict[str, tuple[torch.nn.parallel.DistributedDataParallel, torch.optim.Optimizer, Any]] = {}
    for label, sync in (("on", True), ("off", False)):
        wl = bench_models.build(model_name, device, tiny=True, seed=0)
        ddp = torch.nn.parallel.DistributedDataParallel(wl.model, device_ids=ids)
        sgd = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        sentinel = torch_sentinel.attach(ddp, sgd, sync_ranks=sync, replica_check_every=0)
        copies[label] = (ddp, sgd, sentinel)
    x, y = wl.batch(0)

    def step(ddp: torch.nn.parallel.DistributedDataParallel, opt: torch.optim.Optimizer) -> Callable[[], Any]:
        def run() -> None:
            opt.zero_grad(set_to_none=True)
            for m in range(MICRO):
                with ddp.no_sync() if m < MICRO - 1 else contextlib.nullcontext():
                    wl.loss_fn(ddp(x), y).backward()
            opt.step()
        return run

    times: dict[str, list[float]] = {"on": [], "off": []}
    for i in range(steps):
        order = ("on", "off") if i % 2 else ("off", "on")
        for label in order:
            model, opt, _ = copies[label]
            times[label].append(clock.time(step(model, opt)))
    for _, _, sentinel in copies.values():
        sentinel.detach()
    on, off = _median_ms(times["on"]), _median_ms(times["off"])
    return {
        "allreduce_16b_ms": _median_ms(alone),
        "step_ms": {"sync_ranks": on, "without": off},
        "micro_batches": MICRO,
        "point_ms": (on - off) / MICRO,
        "steps": steps,
    }
