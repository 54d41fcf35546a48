"""The forward of a training step: the root's entry and exit, module outputs, and the hooks
that will deliver the gradients arriving at those outputs in backward.

Hot path: a hook records tensors for the driver's boundaries or launches device ops into slots;
it never reads a device value (see ``collector.py``). The one cold path here is
:meth:`ForwardEvents.rerun_forward`, which runs a faulty step's forward again, every module
watched, to charge the fault to the module that made it.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from typing import Any, Optional

import torch
from torch import nn

from .._errors import SentinelError
from .._record.fault import Fault
from .compat import is_compiling as _is_compiling
from .driver import Driver
from .model_map import post_order
from .open_step import RootCall
from .rerun import RngState, capture_rng, rerun_forward
from .tensors import all_finite, iter_tensors, reducible
from .unwatched import functorch_active

__all__ = ["ForwardEvents", "in_transform"]


def in_transform(driver: Driver) -> bool:
    """Inside ``torch.func.grad``/``vmap``/``jacrev``, tensors are functorch wrappers: an in-place
    write into a slot is refused (grad) or has no batching rule (vmap). Those calls are not
    training steps of the model; they are skipped, with one warning."""
    if _is_compiling() or not functorch_active():  # dynamo traces hooks: no C query there
        return False
    driver.unwatched.transform()
    return True


class ForwardEvents:
    """Receives the root's forward pre-hook and exit hook and every watched module's output."""

    def __init__(self, driver: Driver) -> None:
        self._d = driver
        #: The training call of the root in progress (None between calls).
        self.call: Optional[RootCall] = None
        #: The output most recently seen: a container (or Identity) returning it as is must not
        #: deliver it, or hook its gradient, a second time. Dropped when the root's forward
        #: completes, so no activation outlives its forward.
        self._last_output: Optional[torch.Tensor] = None
        #: The torch RNG state at the entry of the latest root call, once someone asked for it
        #: (:meth:`forward_rng`); reset when the next root call enters.
        self._entry_rng: Optional[RngState] = None
        #: Module slots in the order they first completed a forward pass.
        self._forward_seq: dict[int, int] = {}
        self._post_order = post_order(driver.module_names)
        #: Inside :meth:`rerun_forward`.
        self.rerunning = False
        #: Set by :meth:`quiet`: another component's rerun of the forward is running.
        self._quiet = False
        #: Faults reported while a rerun runs (a rerun that reports one localised it).
        self._rerun_faults = 0
        n = len(driver.module_names)
        self._grad_hooks = [functools.partial(self._on_output_grad, i) for i in range(n)]
        self._grad_prehooks = [functools.partial(self._on_node_grads, i, 0) for i in range(n)]

    # -- the root ---------------------------------------------------------------------
    def on_root_inputs(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        d = self._d
        d.entry.root_entered()
        self._entry_rng = None  # a new root call: the state of the last one is not its
        if d.disabled:
            return None
        call = self.call = RootCall(training=torch.is_grad_enabled())
        if not call.training or in_transform(d):
            return None
        compiling = _is_compiling()
        if d.replacements.pending and not compiling:
            d.replacements.rebind(d.step)
        if not compiling:
            d.flush_pending()  # an earlier forward that raised before its end
            d.drain_landed()
            # Before this step's backward, not only before its update: a library that put back
            # what it saved (our backward wrapper gone) would otherwise cost the step its loss.
            d.hooks.ensure_patches()
            # What a rerun needs if the outputs go bad (references for this forward only).
            call.replay = None if d.watch.everything else (args, kwargs, self.forward_rng())
            call.in_root = True
            # The exception the caller is handling, if any (a retry inside an ``except``): at
            # the exit, another one means this forward raised (see on_root_exit).
            call.handling = id(sys.exc_info()[1])
        d.meta.forward_calls += 1
        d.emit("on_root_inputs", args, kwargs)
        d.entry.emit(args, kwargs, compiling)
        return None

    def forward_rng(self) -> RngState:
        """The torch RNG state (the CPU generator's and the model device's) at the entry of the
        root call in progress: the collector's forward pre-hook, after the pre-hooks registered
        before attach, as the forward itself starts with it. Captured once per root call, by
        the first to ask (the collector's rerun on ordinary steps, the incident recorder, shape
        notes); the others share that copy (host copies, never modified).

        Call it from the root's entry only: the collector's pre-hook, an ``on_root_inputs``
        event, or a root forward pre-hook registered after attach. Asked first later in the
        forward, it would capture the state of that moment.
        """
        state = self._entry_rng
        if state is None:
            state = self._entry_rng = capture_rng(self._d.device)
        return state

    def on_root_exit(self, module: nn.Module, args: Any, output: Any) -> None:
        """The root's forward is over, returned or raised (always called).

        Raised: torch calls this hook from its ``except`` clause, so the exception being
        handled is a new one. Hook order does not tell: slot 0's output hook may run before
        or after this one (``watching.py`` registers it again, last, behind a user's hook).
        """
        self._d.entry.root_exited()
        call = self.call
        if call is not None and call.in_root and id(sys.exc_info()[1]) != call.handling:
            self._forward_raised()

    def _forward_raised(self) -> None:
        """The root's forward raised before its end (its own code, or a hook before ours).

        The outputs it recorded are dropped, not reduced: reduced into the row, they would be
        charged to the batch that runs next in the same step (a loop that catches the error
        and goes on), and held until the next boundary, they would keep the failed forward's
        activations alive past its step. What was written into the row before the raise stays:
        the data's min/max (at the root's entry), a saturation output too large to batch, and
        outputs reduced early because more than ``BatchedMax.cap`` were pending; taking those
        out again would need a copy of the row per forward.
        """
        self._d.drop_pending()
        self.end_call()

    def end_call(self) -> None:
        """Forget the root call in progress and everything it held (its inputs, its outputs)."""
        self.call = None
        self._last_output = None

    def close(self) -> None:
        self.end_call()
        self._entry_rng = None

    # -- module outputs ---------------------------------------------------------------
    def on_output(self, slot: int, module: nn.Module, args: Any, output: Any) -> None:
        if self._quiet:
            return None
        d = self._d
        if self.rerunning:
            self._rerun_output(slot, module, args, output)
            return None
        call = self.call
        # A no_grad region inside a training forward is still the training forward: the
        # reentrant torch.utils.checkpoint runs its block so (the backward recomputes it with
        # grad), and a NaN made there must be charged to the module inside the block.
        if d.disabled or not (torch.is_grad_enabled() or (call is not None and call.training)):
            return None
        compiling = _is_compiling()
        in_root = call is not None and call.in_root
        if slot and not in_root and not compiling:
            # A submodule called from the loop: the root's outputs do not carry its check.
            d.watch.dense_for_good = True
        if not compiling and functorch_active():  # one query each: this runs for every module
            d.unwatched.transform()
            return None
        scope = d.scope
        scope.forward_since_backward = True
        subs = d.table.out[slot]
        emit = d.table.emit
        # The model's outputs (or, for a container whose children the loop calls itself,
        # theirs): a backward that passes through them belongs to the model.
        marking = slot == 0 or not in_root
        marked = False
        for t in (output,) if type(output) is torch.Tensor else iter_tensors(output):
            if not reducible(t):
                d.unwatched.output(t, d.module_names[slot], module)
                continue
            if marking and t.requires_grad:
                if compiling or not scope.mark_outputs(t, slot):
                    scope.unmarked = True
                else:
                    marked = True
            if compiling:
                d.traced = True  # runs once, while tracing: host checks are off from now on
                emit(subs, slot, module, args, t, True)
                continue
            if t is self._last_output:
                # A submodule's output returned as is: already delivered and hooked; on an
                # ordinary step the submodule's delivery skipped the forward check, which the
                # model's outputs carry.
                if slot == 0 and not d.watch.everything:
                    emit(subs, slot, module, args, t, False)
                continue
            self._last_output = t
            if t.requires_grad and (d.gradients.watched[slot] or d.meta.outgrad_complete):
                self._watch_gradient(t, slot)
            emit(subs, slot, module, args, t, False)
        if marking and not marked:
            # Nothing to mark (outputs in an object iter_tensors cannot look into): a backward
            # after this forward is the model's, counted before it runs, not after as a graph
            # cut (its own fresh gradients would then read as stale ones).
            scope.unmarked = True
        if not compiling and slot not in self._forward_seq:
            self._forward_seq[slot] = len(self._forward_seq)
            if slot == 0:  # the root completes last: the first forward's order is known
                d.gradients.plan(sorted(self._forward_seq, key=self._forward_seq.__getitem__))
                d.watch.keep_always([s for s, w in enumerate(d.gradients.watched) if w])
        if slot == 0:
            # The model's forward is over; its replay stays until the boundary below has
            # checked the outputs (a fault there may run the forward again from it).
            self._last_output = None
            if call is not None:
                call.training = call.in_root = False
            if not compiling:
                d.flush_pending()  # the end of the model's forward: a boundary
            self.end_call()
        return None

    def _rerun_output(self, slot: int, module: nn.Module, args: Any, output: Any) -> None:
        """During a rerun only the forward check runs (the step's other evidence is in)."""
        check = self._d.forward_check()
        if check is None:
            return
        for t in (output,) if type(output) is torch.Tensor else iter_tensors(output):
            if reducible(t):
                check(slot, module, args, t, False)

    def forward_order(self) -> list[int]:
        """Module slots in the order they first completed a forward pass.

        Modules never seen completing (all of them under torch.compile, where the order is not
        host bookkeeping) follow in post-order of the module tree, children before their
        parent, as forward hooks complete: a non-finite slot is then charged to the innermost
        module that produced it, never to a container that only passed it on.
        """
        seen = sorted(self._forward_seq, key=self._forward_seq.__getitem__)
        rest = [i for i in self._post_order if i not in self._forward_seq]
        return seen + rest

    # -- gradients arriving at module outputs -----------------------------------------
    def _watch_gradient(self, t: torch.Tensor, slot: int) -> None:
        """Deliver the gradient that will arrive at ``t`` in backward.

        A pre-hook on the node that produced ``t`` costs about half a ``Tensor.register_hook``
        (no Python handle bookkeeping); a leaf that requires grad has no node, so it gets a
        tensor hook.
        """
        node = t.grad_fn
        if node is None:
            t.register_hook(self._grad_hooks[slot])
            return
        nr = t.output_nr
        node.register_prehook(self._grad_prehooks[slot] if nr == 0 else functools.partial(self._on_node_grads, slot, nr))

    def _on_node_grads(self, slot: int, nr: int, grad_outputs: tuple[Optional[torch.Tensor], ...]) -> None:
        self._on_output_grad(slot, grad_outputs[nr])
        return None

    def _on_output_grad(self, slot: int, grad: Optional[torch.Tensor]) -> None:
        d = self._d
        if d.disabled or grad is None or not reducible(grad) or in_transform(d):
            return None
        d.emit("on_output_grad", slot, grad)
        return None

    # -- the cold path ----------------------------------------------------------------
    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """The module hooks record nothing for the duration: another component (shape notes)
        runs the forward again, and its outputs are not a training step's."""
        was, self._quiet = self._quiet, True
        try:
            yield
        finally:
            self._quiet = was

    def fault_seen(self, fault: Fault) -> None:
        """A fault was reported (counted while a rerun runs: the rerun localised it)."""
        if self.rerunning:
            self._rerun_faults += 1

    def rerun_forward(self) -> str:
        """Run this step's forward again with every module watched (cold path, immediate
        mode): a fault the root's outputs detected is then charged to the module that made it.

        Returns ``"localised"`` (a submodule's output was non-finite: reported through the
        forward probe, which usually raised already), ``"root"`` (only the model's own output
        was: its functional code), ``"clean"`` (the rerun's output was finite: not reproduced)
        or ``"failed"`` (no rerun possible, or the forward raised).
        """
        d = self._d
        held = self.call.replay if self.call is not None else None
        if held is None or self.rerunning or d.disabled:
            return "failed"
        args, kwargs, rng = held
        self.rerunning = True
        self._rerun_faults = 0
        try:
            with d.watch.all_hooked():
                # Copies of the inputs: the step's backward may follow ("warn"/"record"), and
                # a forward that changes its inputs in place would change tensors its graph saved.
                output = rerun_forward(d.map.root, args, kwargs, rng, d.device, copy_inputs=True)
                d.flush_pending()
        except SentinelError:
            raise
        except Exception as exc:  # the user's forward failed the second time: say so, go on
            d.drop_pending()
            d.unwatched.rerun_failed(exc)
            return "failed"
        finally:
            self.rerunning = False
        if self._rerun_faults:
            return "localised"
        bad = any(reducible(t) and not all_finite(t) for t in iter_tensors(output))
        return "root" if bad else "clean"
