"""Which modules carry the collector's forward hook, step by step.

A Python forward hook costs a call per module per step, and it takes the module off
``nn.Module``'s hook-free fast path: on a model of small layers that alone is several percent
of the step, whatever the hook does. So in immediate mode (where a fault is found while the
step is still in hand) ordinary steps hook only

- the root, whose outputs carry the step's forward check (a non-finite value anywhere upstream
  reaches them, or is localised by running the forward again: ``rerun.py``);
- the modules whose output gradients are watched every step (:class:`GradientWatch`: outputs
  that feed custom modules, functional code or the loss), where backward faults are localised;
- the modules a probe needs on this step (``Probe.due``: dead-ReLU masks every step, saturation
  and loss-input samples on their own cadence).

Sampled steps (``cadence.py``: the first ten, every tenth up to step 100, then every fiftieth;
the gradient-scale detectors compare all layers on them) hook every module. Deferred mode, where a fault is read back steps later and the
forward cannot be run again, hooks every module on every step; so does a model under
torch.compile (the hooks present when dynamo traced are the ones the graph runs; toggling them
would only blind it or recompile) and a model whose submodules the loop calls directly.
Hooks are added and removed between steps, host bookkeeping only; a set of hooked slots is
computed once per pattern of due probes.

A hook that stays on keeps its place among the module's forward hooks, and torch runs them in
registration order: a hook the user registers after ``attach()`` (one that edits the output,
e.g. clamping or steering an activation) would run after ours, and a NaN it makes would be
charged to the parent. So at each sync a kept hook that is no longer behind every other
non-sentinel hook is registered again, last.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Callable

from torch import nn
from torch.utils.hooks import RemovableHandle

from .._errors import raised_at_entry
from .cadence import sampled
from .compat import forward_hooks, hook_handles_made
from .hookset import ModuleHook
from .probe import Probe
from .schedule import ProbeTable
from .tensors import STANDARD_LAYERS

__all__ = ["GradientWatch", "ModuleWatch"]


class ModuleWatch:
    """The collector's per-module forward hooks, installed on the steps that need them.

    Args:
        modules: the model's ``(name, module)`` list, slot by slot (slot 0 is the root, always
            hooked); a replaced module takes its slot in place (see ``replaced.py``).
        on_output: the collector's hook, called as ``on_output(slot, module, args, output)``.
        table: the probe table, whose ``out_probes`` are each slot's ``on_output`` probes.
    """

    def __init__(self, modules: Sequence[tuple[str, nn.Module]], on_output: Callable[..., None],
                 table: ProbeTable) -> None:
        self._modules = modules
        self._on_output = on_output
        self._table = table
        self._probes: list[Probe] = []
        self._version = -1
        self._handles: dict[int, RemovableHandle] = {}
        #: Hook only what the step needs (immediate mode); False: every module, every step.
        self.sparse = False
        #: Set for good once the model showed it cannot be watched sparsely (see module doc).
        self.dense_for_good = False
        #: Slots hooked on every step besides the root (watched output gradients).
        self._always: frozenset[int] = frozenset()
        self._cache: dict[tuple[bool, ...], frozenset[int]] = {}
        #: ``compat.hook_handles_made()`` after the last install (see ``_install``).
        self._handles_made: int | None = None
        #: Each slot's hook, made once: a sampled step hooks every module again, and new hook
        #: objects for each (with their bound method and arguments) would be thousands of
        #: objects a sampled step for the garbage collector to carry into its oldest generation.
        self._hooks: dict[int, ModuleHook] = {}

    @property
    def everything(self) -> bool:
        """Whether every module is hooked for the step in progress."""
        return len(self._handles) == len(self._modules)

    def keep_always(self, slots: Sequence[int]) -> None:
        self._always = frozenset(slots)
        self._cache.clear()

    def sync(self, step: int, full: bool) -> None:
        """Hook exactly the modules step ``step`` needs (call between steps)."""
        if full or not self.sparse or self.dense_for_good:
            self._install(range(len(self._modules)))
            return
        probes = self._due_probes()
        key = tuple(p.due(step) for p in probes)
        wanted = self._cache.get(key)
        if wanted is None:
            due = {id(p) for p, d in zip(probes, key) if d}
            wanted = frozenset(
                {0, *self._always}
                | {s for s, subs in enumerate(self._table.out_probes) if any(id(p) in due for p in subs)}
            )
            self._cache[key] = wanted
        for slot in [s for s in self._handles if s not in wanted]:
            self._handles.pop(slot).remove()
        self._install(wanted)

    @contextlib.contextmanager
    def all_hooked(self) -> Iterator[None]:
        """Every module hooked for the duration (a rerun); the step's set afterwards."""
        before = set(self._handles)
        self._install(range(len(self._modules)))
        try:
            yield
        finally:
            for slot in [s for s in self._handles if s not in before]:
                self._handles.pop(slot).remove()

    def rebind(self, slot: int) -> None:
        """The module at ``slot`` was replaced: move its hook (if it has one now) to the new
        module; the next sync decides as for any slot."""
        handle = self._handles.pop(slot, None)
        if handle is not None:
            handle.remove()
            self._install((slot,))

    def close(self) -> None:
        while self._handles:
            self._handles.popitem()[1].remove()

    def _install(self, slots: Sequence[int] | frozenset[int] | range) -> None:
        handles, modules = self._handles, self._modules
        made = hook_handles_made()
        # No hook registered anywhere since our last install: the kept hooks are still last.
        check_order = made is None or made != self._handles_made
        for slot in slots:
            module = modules[slot][1]
            handle = handles.get(slot)
            if handle is not None:
                if not check_order or _runs_last(module, handle):
                    continue
                handle.remove()  # a hook registered after ours (see module doc): be last again
            hook = self._hooks.get(slot)
            if hook is None:
                hook = self._hooks[slot] = ModuleHook(raised_at_entry, self._on_output, slot)
            handles[slot] = module.register_forward_hook(hook)
        self._handles_made = hook_handles_made()

    def _due_probes(self) -> list[Probe]:
        """The distinct ``on_output`` probes (recomputed when a subscription changed)."""
        if self._version != self._table.version:
            seen: dict[int, Probe] = {}
            for subs in self._table.out_probes:
                for p in subs:
                    seen.setdefault(id(p), p)
            self._probes = list(seen.values())
            self._version = self._table.version
            self._cache.clear()
        return self._probes


def _runs_last(module: nn.Module, handle: RemovableHandle) -> bool:
    """Whether the hook behind ``handle`` runs after every forward hook of ``module`` that is
    not a sentinel's (another sentinel's hooks only read the output: no need to take turns).
    Only asked after some hook was registered since the last sync; then the usual answer, ours
    is the last one, is the first key looked at."""
    hooks = forward_hooks(module)
    if hooks is None or next(reversed(hooks), None) == handle.id:
        return True
    for hook_id in reversed(hooks):
        if hook_id == handle.id:
            return True
        if not isinstance(hooks[hook_id], ModuleHook):
            return False
    return True  # ours is gone from the dict (removed elsewhere): nothing to reorder


class GradientWatch:
    """Which module outputs get a hook for the gradient arriving at them in backward.

    Every output on sampled steps (:meth:`watch_all_due`); on the others only those whose
    gradient a module's own backward made that could have gone non-finite (:meth:`plan`).
    """

    def __init__(self, modules: Sequence[tuple[str, nn.Module]]) -> None:
        ms = [m for _, m in modules]
        self._standard = [isinstance(m, STANDARD_LAYERS) for m in ms]
        self._is_leaf = [next(iter(m.children()), None) is None for m in ms]
        #: Whether each module's output gradient is watched outside the steps that watch all.
        self.watched = [True] * len(ms)

    @staticmethod
    def watch_all_due(step: int) -> bool:
        """Every output gradient is reduced on sampled steps (``cadence.py``): the
        gradient-scale detectors compare the signal across all layers on those steps."""
        return sampled(step)

    def plan(self, order: list[int]) -> None:
        """Decide, once the execution order is known, which outputs' gradients to reduce.

        The gradient arriving at a module's output is what its consumer's backward produced.
        When both the module and the next leaf module in execution order are standard layers
        (Linear, Conv, norms, value-preserving activations and pools), that backward cannot
        turn finite values into non-finite ones, and the gradient is also seen further down
        (in the next watched output, or the parameters' gradient norms): reducing it would only
        cost bandwidth, on a CNN eleven activation-sized passes of twelve. Outputs that feed
        custom modules, functional code or the loss stay watched, and so do custom modules' own
        outputs, which mark their place in the backward order for localisation.
        """
        leaves = [s for s in order if self._is_leaf[s]]
        for here, after in zip(leaves, leaves[1:]):
            if self._standard[here] and self._standard[after]:
                self.watched[here] = False
