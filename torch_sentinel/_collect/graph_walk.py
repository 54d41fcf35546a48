"""The leaves of the loss's autograd graph, walked on the host at a few steps.

Leaves that require grad but are neither the model's parameters, nor an optimizer's, nor the
model's inputs are evidence of two wiring faults: submodules kept in a plain Python list or raw
tensors with ``requires_grad`` (trainable, but no optimizer updates them), and tensors rebuilt
from the model's output (``torch.tensor(out.tolist(), requires_grad=True)``, a numpy round
trip, ``.detach().requires_grad_()``): a new leaf between the model and the loss, where the
graph was cut. The walk runs at steps 0 and 1, then every ``unregistered_parameter.walk_every``
(500) steps: a few milliseconds of host work, no device read.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Optional

import torch

from .._record import Fact
from .compat import is_compiling as _is_compiling
from .graph import graph_leaves, locate_attribute
from .probe import Probe, ProbeHost
from .scope import attached_param_ids
from .tensors import iter_tensors

__all__ = ["GraphWalk", "LossGraph"]

#: ``attach(thresholds=...)`` key of the walk's interval (declared by ``unregistered_parameter``).
WALK_EVERY = "unregistered_parameter.walk_every"


@dataclasses.dataclass(frozen=True)
class LossGraph(Fact):
    """What one walk of the loss's graph found, on a step that walked it."""

    #: Leaves held by a module but not registered as parameters: label -> (owning module,
    #: shape, elements).
    strays: dict[str, tuple[str, tuple[int, ...], int]]
    #: Parameters registered in the model after attach (a replaced submodule): name -> shape.
    late: dict[str, tuple[int, ...]]
    #: Shapes of leaves that no module holds: tensors rebuilt from the model's output.
    cut_leaves: tuple[tuple[int, ...], ...]
    #: Whether the backward reached any of the model's parameters.
    reached_params: bool


class GraphWalk(Probe):
    name = "graph_walk"
    publishes = (LossGraph,)

    def __init__(self) -> None:
        self._host: Optional[ProbeHost] = None
        self._walking = False
        self._every = 500
        self._known: set[int] = set()
        self._inputs: list[weakref.ref[torch.Tensor]] = []

    def setup(self, host: ProbeHost) -> None:
        self._host = host
        self._every = max(1, int(host.threshold(WALK_EVERY, 500)))
        self._known = {id(p) for p in host.param_tensors}
        # FSDP2 swaps unsharded copies of the parameters in for the forward: the graph's leaves
        # are not the registered DTensors, so the walk would see only strangers.
        self._walking = bool(host.optimizers) and not host.sharded

    def _walk_now(self, step: int) -> bool:
        return step < 2 or step % self._every == 0

    def on_root_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        c = self._host
        if not self._walking or c is None or _is_compiling() or not self._walk_now(c.step):
            return
        self._inputs = [weakref.ref(t) for t in iter_tensors((args, kwargs)) if t.requires_grad]

    def on_backward(self, loss: torch.Tensor) -> None:
        c = self._host
        if not self._walking or c is None or _is_compiling() or not self._walk_now(c.step):
            return
        inputs = {id(r()) for r in self._inputs if r() is not None}
        others = attached_param_ids()  # another attached model's parameters are its own business
        leaves = graph_leaves(loss)
        strays: dict[str, tuple[str, tuple[int, ...], int]] = {}
        late: dict[str, tuple[int, ...]] = {}
        cut: list[tuple[int, ...]] = []
        for leaf in leaves:
            if id(leaf) in self._known or id(leaf) in inputs or id(leaf) in others or not leaf.requires_grad:
                continue
            owner, path = locate_attribute(c.map.modules, leaf)
            if not owner and path == "<unknown>":
                name = _registered_now(c.map.root, leaf)
                if name is not None:
                    late.setdefault(name, tuple(leaf.shape))  # registered after attach: not a cut
                elif len(cut) < 8:
                    cut.append(tuple(leaf.shape))
                continue
            label = f"{owner}.{path}" if owner else path
            strays.setdefault(label, (owner, tuple(leaf.shape), int(leaf.numel())))
        reached = any(id(leaf) in self._known for leaf in leaves)
        c.publish(LossGraph(strays, late, tuple(cut), reached))

    def close(self) -> None:
        self._host = None
        self._inputs = []


def _registered_now(root: torch.nn.Module, leaf: torch.Tensor) -> Optional[str]:
    """The name of ``leaf`` among the model's parameters now, if it was registered after attach
    (cold path: runs only on the rare steps the graph is walked)."""
    for name, p in root.named_parameters():
        if p is leaf:
            return name
    return None
