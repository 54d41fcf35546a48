"""The scheduler: turns hooks and patches into probe events, and rows into records.

The collector owns where events come from (module forward hooks, gradient hooks on module
outputs, optimizer step hooks, the ``backward`` and ``GradScaler`` patches), the ledger row and
the host ring. What is recorded belongs to the probes (``probe.py`` declares the protocol,
``probes/`` holds the built-in ones); the collector calls each probe that implements an event.

Hot-path rules, enforced by the sync-audit tests:
- a hook only launches tensor ops whose results stay on the device (``aminmax`` into slots,
  ``_foreach_norm`` over all parameters at once);
- a hook never reads a device value, except in immediate mode, where on CPU the read is a numpy
  view of the row (a memory load, no torch op) and on accelerators goes through ``read_now``;
- host facts (step counts, shapes, backward order) are plain Python bookkeeping.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
from collections.abc import Iterator
from typing import Any, Callable, Optional

import torch
from torch import nn

from .._errors import SentinelError, raised_at_entry
from .._record import Fact, FactSources, StepMeta, StepRecord
from .._record.fault import Fault
from .batch import BatchedFractions, BatchedMax, OnBad
from .cleared import ClearedGrads
from .closures import ClosureSteps
from .compat import is_compiling as _is_compiling
from .copies import leave_hooks_out_of_copies
from .dtypes import DtypePolicy
from .entry import DataEntry
from .hookset import HookSet, ModuleHook
from .ledger import Ledger
from .listeners import (
    BackwardListener,
    ScaleListener,
    ScalerStepListener,
    WeakHook,
    ZeroGradListener,
)
from .model_map import ModelMap, post_order, trainable_params
from .patches import patch_for
from .probe import Probe
from .probes import (
    AmpProbe,
    DataProbe,
    ForwardProbe,
    LossProbe,
    NormsProbe,
    OutputGradProbe,
    StepProbe,
    UpdateProbe,
)
from .replaced import Replacements
from .rerun import RngState, capture_rng, rerun_forward
from .rows import RowQueue
from .schedule import ProbeTable
from .scope import BackwardScope, OptimizerReach, register_params, unregister_params
from .stepping import BackwardSteps, StepNumbering
from .tensors import all_finite, iter_tensors, reducible
from .transfer import read_now
from .unwatched import Unwatched
from .unwatched import functorch_active as _functorch_active
from .watching import ModuleWatch

__all__ = ["Collector"]

class Collector:
    """Schedules the probes' events and owns the ledger and the host ring.

    ``on_record(record)`` is called on the training thread for each step whose row reached the
    host; ``immediate`` selects whether probes check their own slots on the spot.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizers: list[torch.optim.Optimizer],
        *,
        immediate: bool,
        update_every: int,
        on_record: Callable[[StepRecord], None],
        ring_rows: int = 128,
        thresholds: Optional[dict[str, float]] = None,
    ) -> None:
        self.model = model
        self.map = ModelMap(model)
        #: The decoders of the device facts (``_record/fact.py``), shared by every record.
        self.facts = FactSources()
        self._thresholds = dict(thresholds or {})
        self.optimizers = optimizers
        self.hooks = HookSet()
        self.step = 0
        #: The next step's number (a framework may number steps itself; see stepping.py).
        self.numbering = StepNumbering()
        self.module_names = [n for n, _ in self.map.modules]
        self.params = trainable_params(self.map, optimizers)
        self.param_tensors = [p for _, p in self.params]
        self.device = self.map.device()
        self.ledger = Ledger(self.device)
        for p in self.param_tensors:  # float64 weights and norms need float64 slots from the start
            self.ledger.fit(p.dtype)
        self._dtypes = DtypePolicy(self.ledger)
        self.meta = StepMeta(step=0, outgrad_complete=True)
        #: Module outputs and output gradients waiting for the boundary's one batched reduction.
        self.batch = BatchedMax(self.ledger, self._dtypes)
        #: Sampled outputs waiting for their saturation fractions, at the same boundaries.
        self.fractions = BatchedFractions(self.ledger)
        self.immediate = immediate
        self.disabled = False
        #: Lives exactly as long as this collector, which the model's hooks keep alive: the
        #: sentinel's model-side state (``_model_side.py``), so a kept sentinel never keeps
        #: a dropped model.
        self.anchor: Any = None
        #: Set once a hook was traced by torch.compile: its host checks never run.
        self.traced = False
        #: Optimizers (by id) that already stepped in the row in progress.
        self.stepped_optimizers: set[int] = set()
        self.on_fault: Callable[[Fault], None] = _unhandled
        self.table = ProbeTable(self.map.modules)
        self._subs, self._out_subs, self._emit = self.table.subs, self.table.out, self.table.emit
        #: The output most recently seen in this forward: a container (or Identity) returning
        #: it as is must not deliver it, or hook its gradient, a second time. Dropped when the
        #: root's forward completes, so no activation outlives its forward.
        self._last_output: Optional[torch.Tensor] = None
        self._forward_seq: dict[int, int] = {}
        #: Fallback scoping where the outputs could not be marked (a root hook traced by
        #: torch.compile): a backward after a forward of the model belongs to it.
        self._forward_since_backward = False
        self._unmarked = False
        #: Inside a forward of the root (set by its pre-hook, cleared by its forward hook).
        self._in_root = False
        #: id() of the exception being handled when the root's training forward began.
        self._handling = 0
        #: step(closure): records once, after the first evaluation (closures.py).
        self.closures = ClosureSteps(self._before_update)
        #: Which backward calls reach this model (see scope.py).
        self.reach = OptimizerReach(self.map, optimizers)
        self.scope = BackwardScope(self._backward_reached, self.reach.observe if len(optimizers) > 1 else None)
        #: What a zero_grad() cleared, also in place (cleared.py).
        self.cleared = ClearedGrads(self.map, optimizers, self.param_tensors)
        #: Slot pairs already written in this step (the rest still hold their initial values).
        self._written: set[int] = set()
        # The core probes, in ledger order (the rank agreement's core width ends after misc).
        self.data = DataProbe()
        self.forward = ForwardProbe()
        #: True between the root's forward pre-hook (with grad enabled) and its forward hook.
        self._training_forward = False
        self.loss = LossProbe()
        self.outgrad = OutputGradProbe()
        self.norms = NormsProbe(update_every)
        self.updates = UpdateProbe(self.norms)
        for probe in (self.data, self.forward, self.loss, self.outgrad, self.norms, self.updates):
            self.add_probe(probe)
        #: What enters the model as data (entry.py), and, without an optimizer, each
        #: backward() as a step (stepping.py).
        self.entry = DataEntry(self, self.table)
        #: Submodules assigned after attach(): watched again at the next forward (replaced.py).
        #: Which modules carry the forward hook on the step in progress (watching.py).
        self.watch = ModuleWatch(self.map.modules, self._on_output, self.table)
        #: Inside rerun_forward(); and what it needs: the root call's (args, kwargs, RNG state),
        #: held from the root's pre-hook to the end of its forward on steps not fully watched.
        self.rerunning = False
        #: Set by quiet(): another component's rerun of the forward is running.
        self._quiet = False
        self._root_call: Optional[tuple[tuple[Any, ...], dict[str, Any], RngState]] = None
        #: The torch RNG state at the entry of the latest root call, once someone asked for it
        #: (``forward_rng``); reset when the next root call enters.
        self._entry_rng: Optional[RngState] = None
        self._installed = False
        self.replacements = Replacements(self.map, self.watch.rebind, self._rebound)
        self.backward_steps = BackwardSteps(self, self.table, self.updates)
        #: Shared core slots: the stale-gradient norm (NormsProbe) and the AMP scale (AmpProbe).
        self.misc_block = self.ledger.add_block("misc", ["stale_grad_norm", "amp_scale"])
        self.amp = AmpProbe()
        self.add_probe(self.amp)
        self.add_probe(StepProbe())
        self._post_order = post_order(self.module_names)
        #: One warning per kind of evidence the probes cannot read (see unwatched.py).
        self._unwatched = Unwatched()
        self._grad_hooks = [functools.partial(self._on_output_grad, i) for i in range(len(self.module_names))]
        self._grad_prehooks = [functools.partial(self._on_node_grads, i, 0) for i in range(len(self.module_names))]
        self.rows = RowQueue(self.ledger, self.device, on_record, ring_rows, self.facts)

    # ------------------------------------------------------------------ set-up
    @property
    def immediate(self) -> bool:
        return self.batch.immediate

    @immediate.setter
    def immediate(self, value: bool) -> None:
        self.batch.immediate = value

    @property
    def update_every(self) -> int:
        return self.norms.update_every

    @update_every.setter
    def update_every(self, every: int) -> None:
        self.norms.update_every = every

    @property
    def update_copy_bytes(self) -> int:
        """Bytes of one copy of every watched parameter (the cost of an exact update norm)."""
        return self.updates.copy_bytes

    @property
    def adversarial(self) -> bool:
        """Whether some backward reached this model and another attached one, or (one sentinel
        over a container with several optimizers) one backward reached the parameters of one
        optimizer only and another those of several: a GAN's losses, which oscillate by design."""
        return self.scope.adversarial or self.reach.adversarial

    @property
    def sharded(self) -> bool:
        return bool(self.norms.sharded)

    def add_probe(self, probe: Probe) -> None:
        """Set ``probe`` up and schedule the events it implements; a probe is added once."""
        self.table.add(probe, self)

    def has_probe(self, kind: type[Probe]) -> bool:
        return any(type(p) is kind for p in self.table.probes)

    def step_in_progress(self) -> StepMeta:
        """The host facts of the step in progress (not yet closed)."""
        return self.meta

    def install(self) -> None:
        register_params(self, self.param_tensors)
        root = self.map.root
        self.hooks.add(root.register_forward_pre_hook(ModuleHook(raised_at_entry, self._on_root_inputs), with_kwargs=True))
        self.hooks.add(root.register_forward_hook(ModuleHook(raised_at_entry, self._on_root_exit), always_call=True))
        self.entry.install(root)
        # Process-wide, held weakly: sees `model.head = nn.Linear(...)` when it happens.
        self.hooks.add(nn.modules.module.register_module_module_registration_hook(
            WeakHook(self.replacements.note)))
        self._installed = True
        self._sync_watch()
        for opt in self.optimizers:
            # Weakly: an optimizer the user keeps must not keep the collector (and the model).
            self.hooks.add(opt.register_step_pre_hook(WeakHook(self._on_pre_step)))
            self.hooks.add(opt.register_step_post_hook(WeakHook(self._on_post_step)))
        leave_hooks_out_of_copies(self.hooks)
        self.hooks.subscribe(patch_for(torch.autograd, "backward"), BackwardListener(self))
        zeroing = ZeroGradListener(self)
        self.hooks.subscribe(patch_for(nn.Module, "zero_grad"), zeroing)
        self.hooks.subscribe(patch_for(torch.optim.Optimizer, "zero_grad"), zeroing)
        scaler_cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler_cls is not None:
            self.hooks.subscribe(patch_for(scaler_cls, "scale"), ScaleListener(self))
            self.hooks.subscribe(patch_for(scaler_cls, "step"), ScalerStepListener(self))

    def close(self) -> None:
        self.disabled = True
        self.scope.closed = True
        unregister_params(self)
        self._last_output = None
        self._root_call = None
        self._entry_rng = None
        self.drop_pending()
        try:
            self.watch.close()
            self.entry.close()
            self.hooks.close()
        finally:
            self.table.close()

    # ------------------------------------------------------------------ module watch
    @property
    def fully_watched(self) -> bool:
        return self.watch.everything

    def _sync_watch(self) -> None:
        """Hook what the step in progress needs (between steps; see watching.py)."""
        if not self._installed or self.disabled:
            return
        watch = self.watch
        watch.sparse = self.immediate
        if self.traced:
            watch.dense_for_good = True
        watch.sync(self.step, self.meta.outgrad_complete)
        self.entry.set_active(watch.everything)

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """The module hooks record nothing for the duration: another component (shape notes)
        runs the forward again, and its outputs are not a training step's."""
        was, self._quiet = self._quiet, True
        try:
            yield
        finally:
            self._quiet = was

    def rerun_forward(self) -> str:
        """Run this step's forward again with every module watched (cold path, immediate
        mode): a fault the root's outputs detected is then charged to the module that made it.

        Returns ``"localised"`` (a submodule's output was non-finite: reported through the
        forward probe, which usually raised already), ``"root"`` (only the model's own output
        was: its functional code), ``"clean"`` (the rerun's output was finite: not reproduced)
        or ``"failed"`` (no rerun possible, or the forward raised).
        """
        held = self._root_call
        if held is None or self.rerunning or self.disabled:
            return "failed"
        args, kwargs, rng = held
        self.rerunning = True
        self.forward.localised = False
        try:
            with self.watch.all_hooked():
                # Copies of the inputs: the step's backward may follow ("warn"/"record"), and
                # a forward that changes its inputs in place would change tensors its graph saved.
                output = rerun_forward(self.map.root, args, kwargs, rng, self.device, copy_inputs=True)
                self.flush_pending()
        except SentinelError:
            raise
        except Exception as exc:  # the user's forward failed the second time: say so, go on
            self.drop_pending()
            self._unwatched.rerun_failed(exc)
            return "failed"
        finally:
            self.rerunning = False
        if self.forward.localised:
            return "localised"
        bad = any(reducible(t) and not all_finite(t) for t in iter_tensors(output))
        return "root" if bad else "clean"

    def drain_landed(self) -> None:
        """Hand on the rows that already reached the host (never blocks)."""
        if self.rows.landed():
            self.rows.drain()

    # ------------------------------------------------------------------ for probes
    def publish(self, fact: Fact) -> None:
        self.meta.publish(fact)

    def mark_in_row(self, kind: type[Fact]) -> None:
        self.meta.in_row.add(kind)

    def provide(self, kind: type[Fact], decode: Callable[[StepRecord], Optional[Fact]]) -> None:
        self.facts.provide(kind, decode)

    def threshold(self, key: str, default: float) -> float:
        return float(self._thresholds.get(key, default))

    def host_value(self, i: int) -> float:
        hv = self.ledger.host_view
        return float(hv[i]) if hv is not None else read_now(self.ledger.views[i])

    def finite(self, i: int) -> bool:
        return math.isfinite(self.host_value(i))

    def reduce_into(self, t: torch.Tensor, lo: int, hi: int, compiling: bool = False, probe: str = "") -> None:
        """Fold ``t``'s min and max into the slot pair ``(lo, hi)``, on the device.

        The first write of a pair in a step is a single ``aminmax(out=...)``; later writes (a
        module called twice, gradient accumulation) fold with ``minimum``/``maximum``. Which is
        which is host bookkeeping, skipped while tracing under torch.compile. Which dtypes are
        reduced, and the row's own dtype, are ``dtypes.DtypePolicy``'s call.
        """
        d = t.detach()
        if not self._dtypes.admit(d, compiling, probe):
            return
        views = self.ledger.views
        if not compiling and d.dtype is self.ledger.dtype and lo not in self._written:
            self._written.add(lo)
            torch.aminmax(d, out=(views[lo], views[hi]))
            return
        mn, mx = torch.aminmax(d)
        torch.minimum(views[lo], mn, out=views[lo])
        torch.maximum(views[hi], mx, out=views[hi])

    def reduce_later(self, t: torch.Tensor, lo: int, hi: int, probe: str, on_bad: Optional[OnBad] = None) -> None:
        """Record ``t`` for the slot pair ``(lo, hi)``: its largest ``|x|`` is written at the
        next boundary, batched with every other pending tensor (see ``batch.py``); in
        immediate mode ``on_bad(t)`` is called then if it is non-finite."""
        self.batch.add(t, lo, hi, probe, on_bad, self._written)

    def fraction_later(self, t: torch.Tensor, slot: int, shift: float, edge: float) -> None:
        """Record ``t`` for ``slot``: the fraction of its values beyond ``edge`` from ``shift``
        is written at the next boundary, batched per group of same-sized tensors (see
        ``batch.BatchedFractions``). Eager steps only."""
        self.fractions.add(t, slot, shift, edge)

    def flush_pending(self) -> None:
        """Reduce the pending tensors now (a boundary). A failure that is not a SentinelError
        is a sentinel bug: one warning, the pending tensors are dropped, training goes on."""
        if not (len(self.batch) or len(self.fractions)):
            return
        try:
            self.fractions.flush()  # first: it checks nothing, so it cannot raise a fault
            self.batch.flush(self._written)
        except SentinelError:
            self.drop_pending()
            raise
        except Exception as exc:
            self.drop_pending()
            self._unwatched.batch_failed(exc)

    def drop_pending(self) -> None:
        """Forget the pending tensors without reducing them (an abandoned row, a forward that
        raised, detach): the activations they are go with them."""
        self.batch.drop()
        self.fractions.drop()

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

    def _in_transform(self) -> bool:
        """Inside ``torch.func.grad``/``vmap``/``jacrev``, tensors are functorch wrappers: an
        in-place write into a slot is refused (grad) or has no batching rule (vmap). Those
        calls are not training steps of the model; they are skipped, with one warning."""
        if _is_compiling() or not _functorch_active():  # dynamo traces hooks: no C query there
            return False
        self._unwatched.transform()
        return True

    # ------------------------------------------------------------------ forward events
    def _on_root_inputs(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.entry.root_entered()
        self._entry_rng = None  # a new root call: the state of the last one is not its
        if self.disabled:
            return None
        self._training_forward = torch.is_grad_enabled()
        if not self._training_forward or self._in_transform():
            return None
        compiling = _is_compiling()
        if self.replacements.pending and not compiling:
            self.replacements.rebind(self.step)
        if not compiling:
            self.flush_pending()  # an earlier forward that raised before its end
            self.drain_landed()
            # Before this step's backward, not only before its update: a library that put back
            # what it saved (our backward wrapper gone) would otherwise cost the step its loss.
            self.hooks.ensure_patches()
            # What a rerun needs if the outputs go bad (references for this forward only).
            self._root_call = None if self.watch.everything else (args, kwargs, self.forward_rng())
        self.meta.forward_calls += 1
        self._in_root = not compiling
        # The exception the caller is handling, if any (a retry inside an ``except``): at the
        # exit, another one means this forward raised (see _on_root_exit).
        self._handling = id(sys.exc_info()[1]) if not compiling else 0
        self._emit(self._subs["on_root_inputs"], args, kwargs)
        self.entry.emit(args, kwargs, compiling)
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
            state = self._entry_rng = capture_rng(self.device)
        return state

    def _on_root_exit(self, module: nn.Module, args: Any, output: Any) -> None:
        """The root's forward is over, returned or raised (always called).

        Raised: torch calls this hook from its ``except`` clause, so the exception being
        handled is a new one. Hook order does not tell: slot 0's output hook may run before
        or after this one (``watching.py`` registers it again, last, behind a user's hook).
        """
        self.entry.root_exited()
        if self._in_root and id(sys.exc_info()[1]) != self._handling:
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
        self.drop_pending()
        self._last_output = None
        self._root_call = None
        self._in_root = False
        self._training_forward = False

    def _on_output(self, slot: int, module: nn.Module, args: Any, output: Any) -> None:
        if self._quiet:
            return None
        if self.rerunning:
            self._rerun_output(slot, module, args, output)
            return None
        # A no_grad region inside a training forward is still the training forward: the
        # reentrant torch.utils.checkpoint runs its block so (the backward recomputes it with
        # grad), and a NaN made there must be charged to the module inside the block.
        if self.disabled or not (torch.is_grad_enabled() or self._training_forward):
            return None
        compiling = _is_compiling()
        if slot and not self._in_root and not compiling:
            # A submodule called from the loop: the root's outputs do not carry its check.
            self.watch.dense_for_good = True
        if not compiling and _functorch_active():  # one query each: this runs for every module
            self._unwatched.transform()
            return None
        self._forward_since_backward = True
        subs = self._out_subs[slot]
        # The model's outputs (or, for a container whose children the loop calls itself,
        # theirs): a backward that passes through them belongs to the model.
        marking = slot == 0 or not self._in_root
        marked = False
        for t in (output,) if type(output) is torch.Tensor else iter_tensors(output):
            if not reducible(t):
                self._unwatched.output(t, self.module_names[slot], module)
                continue
            if marking and t.requires_grad:
                if compiling or not self.scope.mark_outputs(t, slot):
                    self._unmarked = True
                else:
                    marked = True
            if compiling:
                self.traced = True  # runs once, while tracing: host checks are off from now on
                self._emit(subs, slot, module, args, t, True)
                continue
            if t is self._last_output:
                # A submodule's output returned as is: already delivered and hooked; on an
                # ordinary step the submodule's delivery skipped the forward check, which the
                # model's outputs carry.
                if slot == 0 and not self.watch.everything:
                    self._emit(subs, slot, module, args, t, False)
                continue
            self._last_output = t
            if t.requires_grad and (self.outgrad.watch[slot] or self.meta.outgrad_complete):
                self._watch_gradient(t, slot)
            self._emit(subs, slot, module, args, t, False)
        if marking and not marked:
            # Nothing to mark (outputs in an object iter_tensors cannot look into): a backward
            # after this forward is the model's, counted before it runs, not after as a graph
            # cut (its own fresh gradients would then read as stale ones).
            self._unmarked = True
        if not compiling and slot not in self._forward_seq:
            self._forward_seq[slot] = len(self._forward_seq)
            if slot == 0:  # the root completes last: the first forward's order is known
                self.outgrad.plan(sorted(self._forward_seq, key=self._forward_seq.__getitem__))
                self.watch.keep_always([s for s, w in enumerate(self.outgrad.watch) if w])
        if slot == 0:
            self._last_output = None
            self._training_forward = False
            self._in_root = False
            if not compiling:
                self.flush_pending()  # the end of the model's forward: a boundary
                self._root_call = None
        return None

    def _rerun_output(self, slot: int, module: nn.Module, args: Any, output: Any) -> None:
        """During a rerun only the forward check runs (the step's other evidence is in)."""
        for t in (output,) if type(output) is torch.Tensor else iter_tensors(output):
            if reducible(t):
                self.forward.on_output(slot, module, args, t, False)

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
        if self.disabled or grad is None or not reducible(grad) or self._in_transform():
            return None
        self._emit(self._subs["on_output_grad"], slot, grad)
        return None

    # ------------------------------------------------------------------ backward events
    def on_scale(self, scaler: Any, outputs: Any, result: Any) -> None:
        if not self.disabled:
            self.amp.on_scale(scaler, outputs, result)

    def before_backward(self, tensors: Any) -> None:
        if self.disabled or self._in_transform():
            return
        if isinstance(tensors, (list, tuple)):
            if len(tensors) != 1:
                return
            tensors = tensors[0]
        if not isinstance(tensors, torch.Tensor) or tensors.numel() != 1 or not tensors.requires_grad:
            return
        self.flush_pending()  # modules called from the loop (no root forward) end here
        loss = self.amp.unscaled(tensors)
        if self._unmarked or not self.scope.supported:
            # Outputs not marked: fall back to "a backward after a forward of the model".
            if self._forward_since_backward:
                self._forward_since_backward = self._unmarked = False
                self._backward_reached(loss)
            return
        after_forward, self._forward_since_backward = self._forward_since_backward, False
        if after_forward and self.immediate:
            # Checked before backward starts, as the first thing a bad loss reaches (the
            # output gradients it makes come next); which model it belongs to comes later.
            self.loss.check_now(loss)
        if not self.scope.begin(tensors, loss, orphan=after_forward) and after_forward:
            self._backward_reached(loss)

    def _backward_reached(self, loss: torch.Tensor) -> None:
        """A backward on ``loss`` passed through the model (on an autograd thread, maybe).

        It counts toward this model's next step unless its gradients are cleared first: a
        backward that reached the model while earlier ones were pending, and finds every
        gradient cleared, drops those (a GAN's generator loss reaches the discriminator, whose
        ``zero_grad()`` then throws those gradients away).
        """
        if self.disabled or self.closures.tail:
            return
        if self.loss.pending_calls and self.cleared.everything():
            self.loss.discard()
            self.norms.cleared()
        self.cleared.reset()
        self.meta.backward_calls += 1
        self.backward_steps.count()
        self._emit(self._subs["on_backward"], loss)

    def _rebound(self, name: str, old: nn.Module, new: nn.Module) -> None:
        self.table.rebind(old, new)
        if "." not in name:
            self.entry.watch(old, new)  # a top-level submodule: data may enter there

    def on_zero_grad(self, owner: Any) -> None:
        """``owner.zero_grad()`` returned (any ``set_to_none``): see cleared.py."""
        if not self.disabled and self.loss.pending_calls:
            self.cleared.note(owner)

    def after_backward(self) -> None:
        """A backward on the model finished.

        A backward that followed a forward of this model but reached no attached model at all
        cut the graph between the model and the loss: it is charged here, as the evidence the
        graph-cut detectors read. Without an optimizer, the backward was a step
        (``stepping.BackwardSteps``); with optimizers, their step hooks close the row.
        """
        if not self.disabled:
            self.flush_pending()  # the end of backward: a boundary
        orphan = self.scope.end()
        if orphan is not None:
            self._backward_reached(orphan)
        self.backward_steps.finish()

    def start_at(self, step: int) -> None:
        """Number the next step ``step`` (a resumed run continues its numbering); before any
        step was recorded."""
        self.step = step
        self.meta = StepMeta(step=step, row=self.meta.row, outgrad_complete=self.outgrad.watch_all_due(step))
        self._sync_watch()

    def observe_loss(self, loss: torch.Tensor) -> None:
        self.loss.observe_loss(loss)

    def observe_validation(self, loss: Any) -> None:
        self.loss.observe_validation(loss)

    def take_pending_validation(self) -> Optional[StepRecord]:
        return self.loss.take_pending_validation()

    # ------------------------------------------------------------------ optimizer events
    def before_scaler_step(self, scaler: Any, optimizer: Any) -> None:
        if optimizer in self.optimizers:
            self.amp.before_scaler_step()

    def after_scaler_step(self, scaler: Any, optimizer: Any, raised: bool = False) -> None:
        if optimizer in self.optimizers and self.amp.after_scaler_step(scaler, raised):
            self.close_row()  # the scaler found inf/NaN and skipped optimizer.step()

    def _on_pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> Optional[tuple[Any, Any]]:
        if self.disabled:
            return None
        self.drain_landed()
        self.hooks.ensure_patches()  # another library may have put back what it saved
        wrapped = self.closures.wrap(optimizer, args, kwargs)
        if wrapped is not None:
            return wrapped
        self._before_update(optimizer)
        return None

    def _before_update(self, optimizer: Any) -> None:
        self.flush_pending()  # gradients are final: nothing pending may reach the update
        with torch.no_grad():
            self._emit(self._subs["on_pre_step"], optimizer)

    def _on_post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.disabled:
            return
        self.closures.end()
        self._emit(self._subs["on_post_step"], optimizer)
        if id(optimizer) in self.stepped_optimizers:
            # This optimizer stepped twice in one row (e.g. several critic steps per generator
            # step): the previous row is complete.
            self.close_row()
        self.stepped_optimizers.add(id(optimizer))
        if len(self.stepped_optimizers) >= len(self.optimizers):
            self.close_row()

    # ------------------------------------------------------------------ rows
    def close_row(self) -> None:
        self.flush_pending()
        meta = self.meta
        self._emit(self._subs["on_row_close"], meta)
        self.rows.push(meta)
        closed = self.step
        self.step = self.numbering.following(self.step)
        self.meta = StepMeta(step=self.step, row=meta.row + 1, outgrad_complete=self.outgrad.watch_all_due(self.step))
        self._last_output = None
        self._root_call = None
        self._in_root = False
        self._written = set()
        self.stepped_optimizers = set()
        if meta.forward_calls == 0 and meta.backward_calls:
            self.watch.dense_for_good = True  # a step without the root's forward (see watching.py)
        self._sync_watch()
        self.rows.drain()
        self._emit(self._subs["on_row_closed"], closed)

    def number_steps(self, start: int, source: Optional[Callable[[], int]] = None) -> None:
        """Number steps as the training framework does: the step in progress is ``start``;
        ``source()``, called when a row closes (inside the last optimizer's step), gives the
        number of the next one (e.g. Lightning's ``global_step + 1``). Numbers only increase."""
        self.step = start
        self.meta.step = start
        self.numbering.source = source

    def abandon_row(self) -> StepRecord:
        """The row in progress as a record, then a fresh row for the same step (cold path).

        Called when a fault raised mid-step: the step never reached ``optimizer.step()``, and a
        loop that catches the error and skips the batch must start the step again from clean
        slots (a NaN left in a slot would be charged to the next, healthy batch). The record
        holds what the aborted step saw up to the fault (``meta.partial``); its
        gradient norms were never taken, so every parameter is listed as missing.
        """
        meta = self.meta
        meta.partial = True
        meta.grad_missing = tuple(n for n, _ in self.params)
        self.drop_pending()
        record = self.rows.take(meta)
        self.meta = StepMeta(step=self.step, row=meta.row, outgrad_complete=self.outgrad.watch_all_due(self.step))
        self._last_output = None
        self._root_call = None
        self._written = set()
        self._forward_since_backward = False
        self.backward_steps.counted = False
        return record

    def drain(self, block: bool = False) -> None:
        """Hand on the rows that reached the host (``block``: wait for every queued row)."""
        self.rows.drain(block)


def _unhandled(fault: Fault) -> None:
    raise SentinelError(f"non-finite value at step {fault.step} ({fault.boundary}, {fault.module})")
