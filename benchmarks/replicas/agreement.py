"""The per-forward collective of the cross-rank agreement (``torch_sentinel/_distributed.py``).

Under ``torch.distributed`` every training forward of the attached model is a lockstep point:
each rank reduces what it recorded since the previous one to two integers on the device and
joins one ``all_reduce(MIN)`` of 16 bytes. With gradient accumulation of *k* micro-batches a
step has *k* points, and the row still open is reduced at each of them (the worst case timed
here). Measured two ways, on the same ranks:

1. the collective alone: ``all_reduce`` of a 16-byte tensor, median of many calls;
2. in situ: forwards of two DDP copies of the tiny variant of the benchmark model (the same
   module structure, so about the same row) under ``no_sync`` (micro-batches, no backward),
   one attached with ``sync_ranks=True``, one with ``sync_ranks=False`` (replica check off in
   both), alternating; the cost of a point is the difference of their medians.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

import torch
import torch.distributed as dist

from .. import models as bench_models

__all__ = ["agreement"]


def _median_ms(times: list[float]) -> float:
    return 1e3 * statistics.median(times)


def agreement(model_name: str, device: torch.device, clock: Any, forwards: int) -> dict[str, Any]:
    """Cost of one agreement point, alone and in situ (every rank calls this)."""
    import torch_sentinel

    payload = torch.zeros(2, dtype=torch.int64, device=device)
    alone = [clock.time(lambda: dist.all_reduce(payload, op=dist.ReduceOp.MIN)) for _ in range(forwards)]

    ids = [device.index] if device.type == "cuda" else None
    copies: dict[str, tuple[torch.nn.parallel.DistributedDataParallel, Any]] = {}
    for label, sync in (("on", True), ("off", False)):
        wl = bench_models.build(model_name, device, tiny=True, seed=0)
        ddp = torch.nn.parallel.DistributedDataParallel(wl.model, device_ids=ids)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        sentinel = torch_sentinel.attach(ddp, opt, sync_ranks=sync, replica_check_every=0)
        copies[label] = (ddp, sentinel)
    x = wl.batch(0)[0]

    def forward(ddp: torch.nn.parallel.DistributedDataParallel) -> Callable[[], Any]:
        def run() -> None:
            with ddp.no_sync():  # a micro-batch: DDP adds no collective of its own
                ddp(x)
        return run

    times: dict[str, list[float]] = {"on": [], "off": []}
    for i in range(forwards):
        order = ("on", "off") if i % 2 else ("off", "on")
        for label in order:
            times[label].append(clock.time(forward(copies[label][0])))
    for _, sentinel in copies.values():
        sentinel.detach()
    on, off = _median_ms(times["on"]), _median_ms(times["off"])
    return {
        "allreduce_16b_ms": _median_ms(alone),
        "forward_ms": {"sync_ranks": on, "without": off},
        "point_ms": on - off,
        "forwards": forwards,
    }
