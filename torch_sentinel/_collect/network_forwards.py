"""How each optimizer's network ran its forward: with gradients, under ``no_grad``, or not at all.

With several networks (an encoder and a critic, a GAN's two), one network can be cut off from
every loss while its own optimizer steps on nothing. How it was cut decides the fix, and a host
check at the network's forward says which: the forward ran under ``torch.no_grad()`` (nothing it
computes enters a graph), or it ran with gradients enabled and no backward reached it (its
output was detached, or the loss does not use it), or it did not run at all.

A network is the largest module of the model whose parameters are all held by one optimizer
(:func:`network_of`); the probe hooks that module's forward (a host check per call: whether
grad mode is on; no tensor is read) and publishes :class:`NetworkForwards` for the step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import torch
from torch import nn

from .._record import Fact
from .probe import Probe, ProbeHost

__all__ = ["NetworkForwards", "NetworkWatch", "network_of"]


def _inside(param_owner: str, module: str) -> bool:
    return module == "" or param_owner == module or param_owner.startswith(module + ".")


def network_of(params: Sequence[str], param_owner: Mapping[str, str], others: Sequence[str]) -> str:
    """The largest module holding all of ``params`` and none of ``others`` (parameters of other
    optimizers): the network an optimizer trains. Its name ("" is the root)."""
    owners = [param_owner.get(p, p.rpartition(".")[0]) for p in params]
    if not owners:
        return ""
    parts = owners[0].split(".") if owners[0] else []
    for owner in owners[1:]:
        o = owner.split(".") if owner else []
        n = 0
        while n < min(len(parts), len(o)) and parts[n] == o[n]:
            n += 1
        parts = parts[:n]
    other_owners = [param_owner.get(p, p.rpartition(".")[0]) for p in others]
    # Walk up from the deepest common module while the parent still holds no other optimizer's
    # parameters: 'encoder.convnet' -> 'encoder' when the encoder's only child is its convnet.
    while parts:
        parent = ".".join(parts[:-1])
        if any(_inside(o, parent) for o in other_owners):
            break
        parts = parts[:-1]
    return ".".join(parts)


@dataclasses.dataclass(frozen=True)
class NetworkForwards(Fact):
    """Per optimizer (in optimizer order): its network's name, and how many of its forward calls
    in this step ran with gradients enabled and under ``no_grad``."""

    networks: tuple[str, ...]
    with_grad: tuple[int, ...]
    without_grad: tuple[int, ...]


class _ForwardSeen:
    def __init__(self, probe: NetworkWatch, index: int) -> None:
        self._probe = probe
        self._index = index

    def __call__(self, module: nn.Module, args: Any, output: Any) -> None:
        self._probe.on_network_forward(self._index)


class NetworkWatch(Probe):
    """Set up with two or more optimizers; one forward hook per network."""

    name = "network_forwards"
    publishes = (NetworkForwards,)

    def __init__(self) -> None:
        self._host: Optional[ProbeHost] = None
        self._networks: tuple[str, ...] = ()
        self._with: list[int] = []
        self._without: list[int] = []
        self._meta: Any = None

    def setup(self, host: ProbeHost) -> None:
        if len(host.optimizers) < 2:
            return
        names = {id(p): n for n, p in host.params}
        groups = [[names[id(p)] for g in o.param_groups for p in g["params"] if id(p) in names]
                  for o in host.optimizers]
        owners = host.map.param_owner
        networks = []
        for i, group in enumerate(groups):
            others = [n for j, g in enumerate(groups) if j != i for n in g]
            networks.append(network_of(group, owners, others) if group else "")
        modules = dict(host.map.modules)
        self._host = host
        self._networks = tuple(networks)
        self._with = [0] * len(networks)
        self._without = [0] * len(networks)
        for i, name in enumerate(networks):
            module = modules.get(name)
            if module is not None and groups[i]:
                host.hooks.add(module.register_forward_hook(_ForwardSeen(self, i)))

    def on_network_forward(self, index: int) -> None:
        host = self._host
        if host is None:
            return
        if self._meta is not host.meta:  # a new step: start its counts
            self._meta = host.meta
            self._with = [0] * len(self._networks)
            self._without = [0] * len(self._networks)
        if torch.is_grad_enabled():
            self._with[index] += 1
        else:
            self._without[index] += 1
        host.publish(NetworkForwards(self._networks, tuple(self._with), tuple(self._without)))

    def close(self) -> None:
        self._host = None
        self._meta = None
