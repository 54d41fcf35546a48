"""Which ``backward()`` belongs to which attached model: the graph says, not the order of calls.

A backward belongs to a sentinel only if its graph reaches that sentinel's model. The root
forward hook puts a pre-hook on the autograd node of each model output (``mark_outputs``);
autograd runs it only when a backward passes through that node. The ``backward`` patch puts a
pre-hook on the loss's own node, which runs first in the same graph task and records which
loss the task is for. So when an output node's hook runs, the current graph task names the loss
that reached the model: right for interleaved forwards, for models trained in two threads, and
on CUDA, where autograd runs the hooks on its device threads. Nothing walks the graph and
nothing keeps it alive: the hooks die with the nodes.

Process-wide facts shared by the attached models live here too: the parameters every attached
model owns (another model's parameters are never "unregistered"), and which graph tasks
reached more than one attached model (an adversarial loop, as in a GAN).
"""

from __future__ import annotations

import collections
import functools
import threading
import weakref
from typing import Any, Callable, Optional

import torch
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["BackwardScope", "OptimizerReach", "attached_param_ids", "current_task", "register_params"]

_current_graph_task_id: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", lambda: -1)

_LOCK = threading.Lock()
#: id(scope) -> the parameter ids of its model, for every attached model.
_PARAMS: dict[int, frozenset[int]] = {}
#: graph task -> the scopes it reached (bounded: the newest tasks only).
_REACHED: collections.OrderedDict[int, list[weakref.ref[BackwardScope]]] = collections.OrderedDict()
_REACHED_MAX = 64


def current_task() -> int:
    """The autograd graph task running on this thread (-1 outside a backward)."""
    return _current_graph_task_id()


def register_params(owner: object, params: list[torch.Tensor]) -> None:
    with _LOCK:
        _PARAMS[id(owner)] = frozenset(id(p) for p in params)


def unregister_params(owner: object) -> None:
    with _LOCK:
        _PARAMS.pop(id(owner), None)


def attached_param_ids(exclude: Optional[object] = None) -> frozenset[int]:
    """Parameters owned by attached models (other than ``exclude``'s)."""
    with _LOCK:
        sets = [s for k, s in _PARAMS.items() if exclude is None or k != id(exclude)]
    return frozenset().union(*sets) if sets else frozenset()


class BackwardScope:
    """One model's view of the backward calls: which of them reached it, and with which loss.

    ``on_reached(loss)`` is called once per graph task that passes through one of the marked
    output nodes, with the loss the task was started on (as the ``backward`` patch saw it).
    ``supported`` is False on a torch without graph task ids: then the caller falls back to
    "a backward after a forward of the model".
    """

    supported = hasattr(torch._C, "_current_graph_task_id")

    def __init__(self, on_reached: Callable[[torch.Tensor], None],
                 on_task_done: Optional[Callable[[set[int]], None]] = None) -> None:
        self._on_reached = on_reached
        #: Called after a backward with the module slots whose outputs it passed through.
        self._on_task_done = on_task_done
        self._task_slots: dict[int, set[int]] = {}
        #: graph task -> the loss it runs for; filled by the loss node's pre-hook.
        self._losses: dict[int, torch.Tensor] = {}
        self._calls = threading.local()
        #: The model's recent outputs: a backward started on one of them reaches the model
        #: without any node running first (its own node is the output's).
        self._outputs: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._output_hooks: dict[int, Callable[[Any], None]] = {}
        #: Set once a graph task reached this model and another attached one.
        self.adversarial = False
        self.closed = False
        #: The fallback where the outputs could not be marked (a root hook traced by
        #: torch.compile, outputs in an object the walk cannot look into): a backward after a
        #: forward of the model belongs to it. Set by the forward events, read by the backward's.
        self.unmarked = False
        self.forward_since_backward = False

    # -- the backward patch (calling thread) ---------------------------------------------
    def begin(self, root: torch.Tensor, loss: torch.Tensor, orphan: bool = False) -> bool:
        """A backward on ``root`` (the tensor given to backward; ``loss`` is its unscaled value)
        is starting on this thread. Returns False when it cannot reach any model (no graph).
        ``orphan``: hand ``loss`` back from :meth:`end` if the backward reaches no attached model."""
        node = root.grad_fn
        if node is None:
            return False
        stack = getattr(self._calls, "stack", None)
        if stack is None:
            stack = self._calls.stack = []
        holder: list[int] = []
        if root in self._outputs:
            # backward() on an output itself (a model that returns its loss): it reaches the
            # model; the output's own hook then finds no loss for the task and stays quiet.
            stack.append((None, holder, None))
            self._on_reached(loss)
            return True

        def on_root(grad_outputs: Any) -> None:
            task = _current_graph_task_id()
            holder.append(task)
            self._losses[task] = loss
            return None

        handle = node.register_prehook(on_root)
        stack.append((handle, holder, loss if orphan else None))
        return True

    def end(self) -> Optional[torch.Tensor]:
        """The backward started by the matching :meth:`begin` returned (or raised). Returns the
        orphan loss if it reached no attached model (a graph cut between model and loss)."""
        stack = getattr(self._calls, "stack", None)
        if not stack:
            return None
        handle, holder, orphan = stack.pop()
        if handle is not None:
            handle.remove()
        for task in holder:
            self._losses.pop(task, None)
            slots = self._task_slots.pop(task, None)
            if slots and self._on_task_done is not None:
                self._on_task_done(slots)
        if orphan is None or not holder:
            return None
        with _LOCK:
            reached = any(_REACHED.get(task) for task in holder)
        return None if reached else orphan

    # -- the model's outputs (forward, then any autograd thread) ------------------------
    def mark_outputs(self, t: torch.Tensor, slot: int = 0) -> bool:
        """Hook the node that produced output ``t`` of module ``slot``; False if it has none."""
        node = t.grad_fn
        if node is None:
            return False
        hook = self._output_hooks.get(slot)
        if hook is None:
            hook = self._output_hooks[slot] = functools.partial(self._reached, slot)
        node.register_prehook(hook)
        self._outputs[t] = True
        return True

    def _reached(self, slot: int, grad_outputs: Any) -> None:
        if self.closed:
            return None
        task = _current_graph_task_id()
        if self._on_task_done is not None and (task in self._losses or task in self._task_slots):
            self._task_slots.setdefault(task, set()).add(slot)
        loss = self._losses.pop(task, None)
        if loss is None:
            return None  # counted already (another output), or not a patched backward (autograd.grad)
        self._note_task(task)
        self._on_reached(loss)
        return None

    def _note_task(self, task: int) -> None:
        me = weakref.ref(self)
        with _LOCK:
            reached = _REACHED.get(task)
            if reached is None:
                reached = _REACHED[task] = []
                while len(_REACHED) > _REACHED_MAX:
                    _REACHED.popitem(last=False)
            reached.append(me)
            others = [r() for r in reached]
        if len(others) > 1:
            for scope in others:
                if scope is not None:
                    scope.adversarial = True


class OptimizerReach:
    """One sentinel over a container with several optimizers (a GAN in one ``nn.ModuleDict``):
    which optimizers' parameters each backward reached. One backward reaching a single
    optimizer's parameters (the discriminator's loss) and another reaching several (the
    generator's loss, through the discriminator) is the adversarial pattern."""

    def __init__(self, model_map: Any, optimizers: list[torch.optim.Optimizer]) -> None:
        self._map = model_map
        self._optimizers = optimizers
        self._slot_optimizers: list[frozenset[int]] = []
        self._sets: set[frozenset[int]] = set()
        self.adversarial = False

    def observe(self, slots: set[int]) -> None:
        """A backward passed through the outputs of module ``slots``."""
        if not self._slot_optimizers:
            held = [{id(p) for g in o.param_groups for p in g["params"]} for o in self._optimizers]
            self._slot_optimizers = [
                frozenset(k for k, ids in enumerate(held) if any(id(p) in ids for p in m.parameters()))
                for _, m in self._map.modules
            ]
        reach = frozenset().union(*(self._slot_optimizers[s] for s in slots))
        if reach and len(self._sets) < 16:
            self._sets.add(reach)
        self.adversarial = any(len(r) == 1 for r in self._sets) and any(len(r) > 1 for r in self._sets)
