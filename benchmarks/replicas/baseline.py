"""The Megatron-style replica check, for comparison: copy every parameter to the CPU, hash it
with SHA-1, all-gather the hashes, compare with rank 0's.

Written after Megatron-LM's ``check_param_hashes_across_dp_replicas`` (``megatron/core/utils.py``):
``hashlib.sha1(param.data.to("cpu").float().numpy(force=True)).digest()`` per parameter, then
``torch.distributed.all_gather`` of the stacked 20-byte digests over a gloo group.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["megatron_check", "sha1_only"]


def megatron_check(params: Sequence[torch.Tensor], group: Any = None) -> bool:
    """Whether every rank's parameter hashes equal rank 0's (a collective: call on every rank)."""
    digests = []
    for p in params:
        array: Any = p.data.to("cpu").float().numpy(force=True)  # no copy on CPU, as in Megatron
        digests.append(torch.frombuffer(bytearray(hashlib.sha1(array).digest()), dtype=torch.uint8))
    local = torch.stack(digests)
    gathered = [torch.zeros_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, local, group=group)
    return bool(torch.equal(local, gathered[0]))


def sha1_only(params: Sequence[torch.Tensor]) -> list[bytes]:
    """The Megatron path's host work alone: the CPU copy and the SHA-1 of each parameter."""
    arrays: list[Any] = [p.data.to("cpu").float().numpy(force=True) for p in params]
    return [hashlib.sha1(a).digest() for a in arrays]
