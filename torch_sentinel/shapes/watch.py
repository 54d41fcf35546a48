"""Shape notes for an attached model at the cost of two hooks per step, not one per module.

A forward hook on every module costs a Python call per module per step, and takes each module
off ``nn.Module``'s hook-free fast path, for notes that matter only on the step that raises.
So on its steps the model carries only hooks on its entry (:class:`ShapeWatch`):

- hot path: the root's forward pre-hook keeps the RNG state (a host copy) for the duration of
  the call; its always-called forward hook drops it. Nothing else: no tensor is kept, no
  tensor op runs. The state is the collector's (``Collector.forward_rng``: one copy per root
  call, shared with the collector's own rerun and the incident recorder); the pre-hook runs
  after the collector's, as the forward starts, so a rerun begins from the state the forward
  began with. A top-level child called from the loop is another call: its entry copies its own.
- cold path, when an exception leaves the root's forward: the innermost module on the
  traceback and its inputs tell whether it is a shape error (the same test the note makes).
  If it is, the forward runs again (``_collect/rerun.py``: same inputs, RNG state and weights,
  under ``no_grad``; buffers and RNG put back) with :class:`~.notes.ShapeNotes`' per-module
  hooks installed. The error recurs at the same module and the hooks build the same note as
  when they were installed on the step itself (producers included); the note and the
  ``shape_mismatch`` finding go on the ORIGINAL exception, which keeps its type and traceback,
  and the hooks are removed again. If the rerun raises something else, or nothing (the
  forward depends on something that changed), the note is made from the traceback alone and
  says that the producers were not traced.

Modules called directly from the loop (a container whose children the loop calls, e.g. a GAN's
``netG``/``netD``) have no root forward: their top-level children are entries too. They are
hooked from attach; a root whose forward the loop calls loses those hooks at its first forward
(each would cost two Python calls per child per step, and take the child off ``nn.Module``'s
hook-free fast path: on a 10-layer ``nn.Sequential`` 20 calls a step, for notes of calls that
never come), and gets them back for good if a step ever closes without a training forward of
the root (a GAN container never calls its root: its hooks stay from the start). A loop that calls
the root and, in the same step, a child directly gets the traceback's note for the child's
shape error (without its producers).

Under ``torch.distributed`` a forward with collectives in it (SyncBatchNorm, FSDP, DTensor
parameters) is not run again on one rank: the note is made from the traceback.

Under ``torch.compile`` hooks traced into the graph do nothing (as before); the root's hooks
run eagerly, and the rerun runs eagerly too (dynamo disabled for it): a shape error raised
while dynamo traced gets the eager rerun's note, saying so; an error of torch.compile's own
that the eager rerun does not raise gets no shape note.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import types
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .._collect.compat import CALL_IMPL_CODE
from .._collect.compat import is_compiling as _is_compiling
from .._collect.hookset import HookSet, ModuleHook
from .._collect.probe import Probe, ProbeHost
from .._collect.rerun import RngState, capture_rng, rerun_forward
from .._collect.tensors import iter_tensors
from .._errors import SentinelError, ShapeContractError
from .._findings import Finding
from .._record import StepMeta
from .notes import Annotation, ShapeNotes, mark_seen, seen, worth_a_note

__all__ = ["ShapeWatch", "install_shape_notes", "module_calls"]

logger = logging.getLogger("torch_sentinel")

_OOM: tuple[type[BaseException], ...] = tuple(
    t for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None))
    if isinstance(t, type)
)
_EAGER_NOTE = ("located by running the forward again eagerly: the error above was raised while "
               "torch.compile traced the model")


def module_calls(tb: Optional[types.TracebackType], slots: dict[int, int]) -> list[tuple[int, nn.Module, tuple[Any, ...]]]:
    """(slot, module, args) of each ``nn.Module`` call on the traceback ``tb``, outermost
    first, for the modules in ``slots`` (id(module) -> slot). ``args`` are those the module's
    forward received (after its pre-hooks)."""
    calls = []
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code is CALL_IMPL_CODE:
            local = frame.f_locals
            module = local.get("self")
            slot = slots.get(id(module))
            if slot is not None and isinstance(module, nn.Module):
                args = local.get("args", ())
                calls.append((slot, module, args if isinstance(args, tuple) else (args,)))
        tb = tb.tb_next
    return calls


class ShapeWatch(Probe):
    """The hooks on the model's entry and the cold path that explains a shape error.

    Args:
        notes: the per-module note hooks, installed only while an error is explained.
        root: the attached model (slot 0 of ``notes.modules``).
        device: the model's device (whose RNG the rerun restores).
        hooks: where the entry hooks go (removed at detach).
    """

    name = "shape_notes"

    def __init__(self, notes: ShapeNotes, root: nn.Module, device: torch.device, hooks: HookSet,
                 quiet: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext) -> None:
        self.notes = notes
        self._device = device
        self._hooks = hooks
        #: Silences the collector's hooks during the rerun (its outputs are not a training step's).
        self._quiet = quiet
        #: (module, RNG state at its entry) of each entry call in progress, outermost first.
        self._entries: list[tuple[nn.Module, Optional[RngState]]] = []
        #: Training (grad-enabled) calls of the root since the last row closed.
        self._root_calls = 0
        #: Which module produced each output of a top-level child called from the loop
        #: (id -> (slot, shape): plain ints, no tensor).
        self._loop_produced: dict[int, tuple[int, torch.Size]] = {}
        self._child_handles: list[RemovableHandle] = []
        #: Inside the cold path: the rerun's calls are not entries.
        self._explaining = False
        self._host: Optional[ProbeHost] = None
        children = [slot for slot, (name, _) in enumerate(notes.modules) if name and "." not in name]
        self._children = children
        #: Whether the children's entry hooks stay on even when the root is called (set once a
        #: step closed without a training forward of the root).
        self.children_for_good = False
        # Not prepended: after the collector's pre-hook (registered at install, before this), so
        # the RNG state is the one the collector's rerun and the incident recorder share.
        hooks.add(root.register_forward_pre_hook(ModuleHook(self._on_enter, 0), with_kwargs=True))
        hooks.add(root.register_forward_hook(ModuleHook(self._on_exit, 0), with_kwargs=True, always_call=True))
        self._hook_children()

    @property
    def hooked_children(self) -> bool:
        """Whether the top-level children carry entry hooks now."""
        return bool(self._child_handles)

    def setup(self, host: ProbeHost) -> None:
        self._host = host

    # ------------------------------------------------------------------ hot path
    def _on_enter(self, slot: int, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if _is_compiling() or self._explaining:
            return None
        if slot == 0:
            # An entry still open here was left by a KeyboardInterrupt (always-called hooks
            # run only for an Exception); the root does not call itself.
            self._entries.clear()
            if torch.is_grad_enabled():
                self._root_calls += 1
            if self._child_handles and not self.children_for_good:
                self._unhook_children()
        elif self._entries:
            return None  # a child called inside an entry (the root's forward): not an entry
        host = self._host
        # The root's call: the state the collector keeps for it. A child called from the loop
        # is no root call (the collector's copy is the last root call's): its own copy.
        rng = host.forward_rng() if slot == 0 and host is not None else capture_rng(self._device)
        self._entries.append((module, rng))
        return None

    def _on_exit(self, slot: int, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                 output: Any) -> None:
        if _is_compiling() or self._explaining:
            return None
        entries = self._entries
        if entries and entries[-1][0] is module:
            rng = entries.pop()[1]
        elif slot == 0:
            rng = None  # the root's pre-hook did not run (an earlier pre-hook raised)
        else:
            return None  # a child called inside an entry
        if output is not None:
            if slot:
                self._produced_by_child(slot, output)
            return None
        exc = sys.exc_info()[1]
        if exc is not None:
            self._explaining = True
            try:
                self._explain(slot, module, args, kwargs, rng, exc)
            except Exception as bug:  # a note must never replace the user's error
                logger.warning("torch_sentinel: the shape note could not be made (%s: %s)", type(bug).__name__, bug)
            finally:
                self._explaining = False
        return None

    def _produced_by_child(self, slot: int, output: Any) -> None:
        produced = self._loop_produced
        if len(produced) > 64:
            produced.clear()
        for t in iter_tensors(output):
            if not t.is_nested:
                produced[id(t)] = (slot, t.shape)

    def on_row_close(self, meta: StepMeta) -> None:
        """A step without a training forward of the root: the loop calls its children (unless
        the hooks were traced by torch.compile, which counts nothing)."""
        traced = self._host is not None and self._host.traced
        if not self._root_calls and not self._child_handles and self._children and not traced:
            self.children_for_good = True
            self._hook_children()
        self._root_calls = 0
        self._entries.clear()  # no entry is open between steps

    def _hook_children(self) -> None:
        modules = self.notes.modules
        for slot in self._children:
            child = modules[slot][1]
            self._child_handles.append(self._hooks.add(
                child.register_forward_pre_hook(ModuleHook(self._on_enter, slot), with_kwargs=True)))
            self._child_handles.append(self._hooks.add(
                child.register_forward_hook(ModuleHook(self._on_exit, slot), with_kwargs=True, always_call=True)))

    def _unhook_children(self) -> None:
        while self._child_handles:
            self._child_handles.pop().remove()

    def close(self) -> None:
        self._unhook_children()
        self._entries.clear()
        self._loop_produced.clear()

    # ------------------------------------------------------------------ cold path
    def _explain(self, slot: int, entry: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                 rng: Optional[RngState], exc: BaseException) -> None:
        """Note ``exc``, which left the forward of ``entry`` (at ``slot``), if it is a shape error."""
        if seen(exc) or not isinstance(exc, Exception) or isinstance(exc, _OOM):
            return
        if isinstance(exc, SentinelError) and not isinstance(exc, ShapeContractError):
            return  # the sentinel's own errors explain themselves
        notes = self.notes
        slots = {id(m): i for i, (_, m) in enumerate(notes.modules)}
        calls = module_calls(exc.__traceback__, slots)
        if not any(m is entry for _, m, _ in calls):
            return  # not raised through this call (a stale exception in sys.exc_info())
        inner_slot, inner, inner_args = calls[-1]
        if not worth_a_note(notes.names[inner_slot], inner, inner_args, exc):
            mark_seen(exc)
            return
        produced = dict(self._loop_produced) if slot else None
        outcome, annotation, extra = "not run", None, None
        # A contract's own message needs no producer; a forward with collectives in it must not
        # run again on this rank alone (the others would not join: a hang).
        if not isinstance(exc, ShapeContractError) and _collective_free(entry):
            outcome, annotation, extra = self._rerun(slot, entry, args, kwargs, rng, exc, produced)
        if outcome == "passed" and _from_dynamo(exc):
            mark_seen(exc)
            return  # the model's shapes work eagerly: torch.compile's own error, not a shape bug
        if outcome not in ("same", "eager"):
            notes.seed(args, kwargs, batch=slot == 0, produced=produced)
            notes.traced = False
            try:
                annotation = notes.describe(inner_slot, inner, inner_args, exc)
            finally:
                notes.traced = True
                notes.forget()
        if annotation is not None:
            notes.apply(exc, annotation, extra=extra)
        else:
            mark_seen(exc)

    def _rerun(self, slot: int, entry: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
               rng: Optional[RngState], exc: BaseException,
               produced: Optional[dict[int, tuple[int, torch.Size]]]) -> tuple[str, Optional[Annotation], Optional[str]]:
        """Run ``entry``'s forward again with the note hooks on every module: (what happened,
        the annotation, a line to add to the note). What happened: "same" (the same error
        recurred), "eager" (compiled code's error, explained by the eager rerun), "passed" (no
        error) or "other" (another error)."""
        notes = self.notes
        captured: list[Annotation] = []
        temp = HookSet()
        again: Optional[BaseException] = None
        try:
            notes.seed(args, kwargs, batch=slot == 0, produced=produced)
            notes.capture(captured)
            # Not on the entry itself: its forward is called directly, and its forward hooks
            # are being iterated right now (torch's except path iterates the dict itself).
            notes.watch(temp, skip=entry)
            try:
                with self._quiet():
                    _eagerly(rerun_forward)(entry, args, kwargs, rng, self._device)
            except Exception as e:
                again = e
            if again is None:
                return "passed", None, None
            if type(again) is type(exc) and str(again) == str(exc):
                if captured:
                    return "same", captured[0], None
                if seen(again):
                    return "same", None, None  # the innermost module decided: no note
                # Raised by the entry's own forward (functional code in it, or a single layer).
                return "same", notes.describe(slot, entry, args, again), None
            if captured and _from_dynamo(exc):
                return "eager", captured[0], _EAGER_NOTE
            return "other", None, None
        finally:
            again = None  # its traceback holds the rerun's frames (activations): drop it now
            temp.close()
            notes.capture(None)
            notes.forget()


def _from_dynamo(exc: BaseException) -> bool:
    """Whether torch.compile raised ``exc`` itself (while tracing or compiling)."""
    return type(exc).__module__.startswith("torch._dynamo")


def _collective_free(module: nn.Module) -> bool:
    """Whether ``module``'s forward can run on this rank alone: no process group of several
    ranks, or no SyncBatchNorm, FSDP-sharded module or DTensor parameter in it."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return True
    for m in module.modules():
        if isinstance(m, nn.SyncBatchNorm) or "FSDP" in type(m).__name__ or "FullyShard" in type(m).__name__:
            return False
    return not any(type(p).__name__ == "DTensor" for p in module.parameters())


def _eagerly(fn: Any) -> Any:
    """``fn`` with torch.compile's frame evaluation off (a rerun from inside a compiled call's hook)."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return disable(fn) if disable is not None else fn


def install_shape_notes(collector: Any, on_finding: Callable[[Finding], None], rank: Optional[int]) -> ShapeWatch:
    """Wire shape notes into a sentinel's collector: the entry hooks go in its HookSet (so
    detach removes them), findings to ``on_finding(finding)``, the step from ``collector.step``."""
    notes = ShapeNotes(collector.map.modules, on_finding=on_finding, step=lambda: collector.step, rank=rank)
    watch = ShapeWatch(notes, collector.map.root, collector.device, collector.hooks, collector.quiet)
    collector.add_probe(watch)
    return watch
