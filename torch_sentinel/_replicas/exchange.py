"""The collectives of a replica check, built so that a failure on one rank never leaves the
others waiting.

Every gathered payload carries a status word. A rank whose local work raised (out of memory,
an unsupported dtype) still takes part in the collective, with status 1 and zeros; every rank
then sees the same failure in the gathered data and stops the check at the same point.

Reading the gathered tensor is the check's one host read (on accelerators, a wait for the
collective): it happens at check steps only, every ``replica_check_every`` steps, by design.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["Gathered", "agree_world", "gather_rows"]

logger = logging.getLogger("torch_sentinel")


class Gathered:
    """Rows gathered from every rank of a group: ``rows[i]`` came from group rank ``i``.

    ``failed`` lists the group ranks whose local work raised (then ``rows`` holds zeros there).
    """

    def __init__(self, rows: np.ndarray, failed: list[int]) -> None:
        self.rows = rows
        self.failed = failed


def gather_rows(compute: Callable[[], torch.Tensor], shape: Sequence[int], group: Any, size: int,
                device: torch.device, what: str) -> Gathered:
    """Compute this rank's int64 rows of ``shape`` and gather everyone's, failures included.

    Args:
        compute: returns this rank's rows (int64, ``shape``); may raise.
        shape: the shape every rank sends (known to all ranks without asking).
        group: the process group; size: its size; device: where the collective wants tensors.
        what: named in the log line of a local failure.
    """
    status = 0
    try:
        rows = compute().to(device=device, dtype=torch.int64).reshape(tuple(shape))
    except Exception as exc:  # the others must not wait for us: send zeros and status 1
        logger.warning("torch_sentinel: replica check could not compute %s on this rank (%s: %s)",
                       what, type(exc).__name__, exc)
        rows, status = torch.zeros(tuple(shape), dtype=torch.int64, device=device), 1
    flat = torch.cat([rows.reshape(-1), torch.tensor([status], dtype=torch.int64, device=device)])
    out = torch.empty((size, flat.numel()), dtype=torch.int64, device=device)
    dist.all_gather(list(out.unbind(0)), flat, group=group)
    gathered = out.cpu().numpy()  # the one host read of this exchange (cold path: check steps)
    failed = [int(r) for r in np.flatnonzero(gathered[:, -1])]
    return Gathered(gathered[:, :-1].reshape((size, *shape)), failed)


def agree_world(code: int, payload: Optional[dict[str, Any]], device: torch.device) -> list[dict[str, Any]]:
    """Tell every rank of the world what any replica group found, so that all act alike.

    ``code``: 0 nothing found, 1 a divergence, 2 a failure. One 8-byte ``all_reduce(MAX)``; only
    when some rank reports something, an ``all_gather_object`` of the payloads (cold path).
    Returns the non-empty payloads in rank order (the same list on every rank).
    """
    flag = torch.tensor([code], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if int(flag.item()) == 0:  # host read at check steps only
        return []
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, payload)
    return [p for p in everyone if p]
