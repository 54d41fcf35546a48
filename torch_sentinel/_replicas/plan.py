"""Which tensors are replicas of each other, across which process group, and how often to check.

- **DDP** (the model passed to ``attach()`` is, or wraps, ``DistributedDataParallel``): every
  parameter of the inner module (names without ``module.``), minus DDP's
  ``parameters_to_ignore``, across DDP's own process group. On by default.
- **DTensor parameters** (FSDP2 ``fully_shard``, HSDP, ``replicate``): the local shard of each
  parameter is compared across each mesh dimension along which it is *replicated* (HSDP's
  replicate dimension). A parameter sharded along every mesh dimension (plain FSDP) has no
  replica: it is skipped, and one info finding says so. On by default when some parameter is
  replicated along a mesh dimension.
- **Anything else under a process group** (a model not wrapped, whose replicas the loop keeps in
  sync itself): only when ``replica_check_every`` is given, across the default group.

Buffers are not compared: DDP broadcasts rank 0's at every forward by default, and running
statistics legitimately differ with ``broadcast_buffers=False``.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn

from .._collect.shards import local

__all__ = ["DEFAULT_EVERY", "Plan", "ReplicaGroup", "Snapshot", "Tracked", "build_plan", "gather_device"]

#: Steps between checks when ``replica_check_every`` is left at None and replicas are found.
DEFAULT_EVERY = 200

try:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Replicate
except ImportError:  # pragma: no cover - torch built without distributed
    DTensor = None  # type: ignore[assignment,misc]
    Replicate = None  # type: ignore[assignment,misc]


@dataclasses.dataclass(frozen=True)
class Tracked:
    """One compared tensor: a parameter, or one optimizer state tensor of a parameter."""

    parameter: str
    state: Optional[str] = None

    @property
    def name(self) -> str:
        return self.parameter if self.state is None else f"{self.parameter}:{self.state}"


@dataclasses.dataclass
class Snapshot:
    """What one rank compares at one check: names, tensors and their layouts' checksums."""

    tracked: list[Tracked]
    tensors: list[torch.Tensor]
    #: How many of ``tracked`` are parameters (they come first; optimizer state follows).
    params: int
    param_layout: int
    state_layout: int
    #: One checksum per parameter of the layout of its optimizer state (names, shapes, dtypes).
    state_layouts: list[int]


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


def _layout(name: str, t: torch.Tensor) -> str:
    t = local(t)
    return f"{name}|{tuple(t.shape)}|{t.dtype}"


class ReplicaGroup:
    """Parameters that are replicas of each other across one process group.

    Args:
        group: the process group (None: the default group).
        params: (qualified name, parameter) in model order, the same on every rank.
    """

    def __init__(self, group: Any, params: Sequence[tuple[str, torch.Tensor]]) -> None:
        self.group = group
        self.params = list(params)
        #: Global ranks, in the group's order (index i of a gathered tensor is ranks[i]).
        self.ranks: list[int] = list(dist.get_process_group_ranks(group or dist.group.WORLD))
        self.size = len(self.ranks)
        self.device = gather_device(group, params[0][1] if params else None)

    def snapshot(self, optimizers: Sequence[torch.optim.Optimizer]) -> Snapshot:
        """The tensors to compare now: the parameters, then each one's optimizer state tensors
        (Adam's ``exp_avg``, ``exp_avg_sq``, ``step``, ...), which appear after the first step."""
        tracked = [Tracked(name) for name, _ in self.params]
        tensors = [p for _, p in self.params]
        param_layout = _crc(";".join(_layout(n, p) for n, p in self.params))
        state_text: list[str] = []
        state_layouts: list[int] = []
        for name, p in self.params:
            entries: list[str] = []
            for i, opt in enumerate(optimizers):
                state = opt.state.get(p)
                if not state:
                    continue
                for key in sorted(state, key=str):
                    value = state[key]
                    if isinstance(value, torch.Tensor) and value.numel() > 0:
                        label = str(key) if len(optimizers) == 1 else f"{i}.{key}"
                        tracked.append(Tracked(name, label))
                        tensors.append(value)
                        entries.append(_layout(label, value))
            state_layouts.append(_crc(";".join(entries)))
            state_text.append(";".join(entries))
        return Snapshot(tracked, tensors, len(self.params), param_layout,
                        _crc("/".join(state_text)), state_layouts)


def gather_device(group: Any, example: Optional[torch.Tensor]) -> torch.device:
    """Where a collective on ``group`` wants its tensors: the CPU for gloo, the current CUDA
    device for NCCL, else the parameters' device."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if "gloo" in backend or example is None:
        return torch.device("cpu")
    return local(example).device


@dataclasses.dataclass
class Plan:
    """What a replica check compares; empty ``groups`` means nothing to do."""

    every: int
    groups: list[ReplicaGroup]
    #: Parameters skipped because they are sharded along every mesh dimension (no replica).
    sharded: list[str]
    #: Whether some rank may sit in another replica group than this rank's (then the verdict
    #: is agreed across the whole world, so that no rank keeps training while others raise).
    partial_groups: bool


def _replicate_groups(p: torch.Tensor) -> Optional[list[tuple[tuple[int, int], Any]]]:
    """For a DTensor: ((mesh id, dim), group) of each mesh dimension it is replicated along
    (an empty list if it is sharded along all); None for a plain tensor."""
    if DTensor is None or not isinstance(p, DTensor):
        return None
    mesh = p.device_mesh
    return [((id(mesh), dim), mesh.get_group(dim))
            for dim, placement in enumerate(p.placements) if isinstance(placement, Replicate)]


def _ddp(model: nn.Module) -> Optional[nn.parallel.DistributedDataParallel]:
    """The DistributedDataParallel in ``model``'s wrappers (torch.compile around DDP), if any."""
    seen: set[int] = set()
    while id(model) not in seen:
        seen.add(id(model))
        if isinstance(model, nn.parallel.DistributedDataParallel):
            return model
        inner = getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return None
        model = inner
    return None


def build_plan(model: nn.Module, root: nn.Module, every: Optional[int]) -> Optional[Plan]:
    """The replica check for ``model`` (as passed to ``attach()``; ``root``: without wrappers),
    or None when there is nothing to compare: no process group of more than one rank,
    ``every == 0``, or (``every`` None) neither DDP nor a replicated mesh dimension."""
    if every == 0 or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    named = list(root.named_parameters())
    ddp = _ddp(model)
    if ddp is not None:
        ignored = set(getattr(ddp, "parameters_to_ignore", ()))
        params = [(n, p) for n, p in named if n not in ignored]
        group = ReplicaGroup(ddp.process_group, params)
        partial = group.size < dist.get_world_size()
        return Plan(every or DEFAULT_EVERY, [group] if params else [], [], partial)
    by_key: dict[Any, tuple[Any, list[tuple[str, torch.Tensor]]]] = {}
    plain: list[tuple[str, torch.Tensor]] = []
    sharded: list[str] = []
    for name, p in named:
        groups = _replicate_groups(p)
        if groups is None:
            plain.append((name, p))
        elif not groups:
            sharded.append(name)
        for key, group in groups or ():
            by_key.setdefault(key, (group, []))[1].append((name, p))
    replicated = [ReplicaGroup(g, ps) for g, ps in by_key.values() if dist.get_world_size(g) > 1]
    if every is None:
        # Only what is replicated by construction; a plain model may hold rank-local weights.
        return Plan(DEFAULT_EVERY, replicated, sharded, True) if replicated or sharded else None
    if plain:
        replicated.append(ReplicaGroup(None, plain))
    partial = any(g.size < dist.get_world_size() for g in replicated)
    return Plan(every, replicated, sharded, partial)
