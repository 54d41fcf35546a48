"""The driver: routes hook events to the probes, and sealed steps to the host.

The collector owns the step in progress (:class:`~.open_step.OpenStep`, replaced whole when the
step closes), the probe table, the ledger row and the queue of closed rows. Events come from
three sources, one per part of a training step (``events_forward.py``, ``events_backward.py``,
``events_optimizer.py``); what is recorded belongs to the probes (``probe.py`` declares the
protocol, ``probes/`` holds the built-in ones); when it is reduced, to ``boundaries.py``.

Hot-path rules, enforced by the sync-audit tests:
- a hook only launches tensor ops whose results stay on the device (``aminmax`` into slots,
  ``_foreach_norm`` over all parameters at once);
- a hook never reads a device value, except in immediate mode, where on CPU the read is a numpy
  view of the row (a memory load, no torch op) and on accelerators goes through ``read_now``;
- host facts (step counts, shapes, backward order) are plain Python bookkeeping.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch
from torch import nn

from .._errors import SentinelError, raised_at_entry
from .._record import Fact, FactSources, StepMeta, StepRecord
from .._record.fault import Fault
from .amp import AmpTracker
from .batch import OnBad
from .boundaries import Boundaries, Pending
from .cleared import ClearedGrads
from .closures import ClosureSteps
from .copies import leave_hooks_out_of_copies
from .entry import DataEntry
from .events_backward import BackwardEvents, BackwardListener, ScaleListener, ZeroGradListener
from .events_forward import ForwardEvents
from .events_optimizer import OptimizerEvents, ScalerStepListener
from .hookset import HookSet, ModuleHook, WeakHook
from .ledger import Ledger
from .loss_tally import LossTally
from .model_map import ModelMap, trainable_params
from .open_step import OpenStep
from .patches import patch_for
from .probe import Probe
from .probes import DataProbe, ForwardProbe, NormsProbe, OutputGradProbe, StepProbe, UpdateProbe
from .replaced import Replacements
from .rerun import RngState
from .rows import RowQueue
from .schedule import ProbeTable
from .scope import BackwardScope, OptimizerReach, register_params, unregister_params
from .shards import ShardedNorms
from .stepping import BackwardSteps, StepNumbering
from .tensors import nbytes
from .transfer import read_now
from .unwatched import Unwatched
from .watching import GradientWatch, ModuleWatch

__all__ = ["Collector"]


class Collector:
    """Schedules the probes' events and owns the step in progress, the ledger and the rows.

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
        #: The next step's number (a framework may number steps itself; see stepping.py).
        self.numbering = StepNumbering()
        self.module_names = [n for n, _ in self.map.modules]
        self.params = trainable_params(self.map, optimizers)
        self.param_tensors = [p for _, p in self.params]
        self.device = self.map.device()
        self.ledger = Ledger(self.device)
        for p in self.param_tensors:  # float64 weights and norms need float64 slots from the start
            self.ledger.fit(p.dtype)
        #: Whether some parameter is sharded (DTensor / FSDP2): graph leaves are not the params.
        self.sharded = bool(ShardedNorms(self.param_tensors))
        #: Bytes of one copy of every watched parameter (the cost of an exact update norm).
        self.update_copy_bytes = sum(nbytes(p) for p in self.param_tensors)
        self.gradients = GradientWatch(self.map.modules)
        self.open = OpenStep(StepMeta(step=0, outgrad_complete=True))
        self.disabled = False
        #: Lives exactly as long as this collector, which the model's hooks keep alive: the
        #: sentinel's model-side state (``_model_side.py``), so a kept sentinel never keeps
        #: a dropped model.
        self.anchor: Any = None
        #: Set once a hook was traced by torch.compile: its host checks never run.
        self.traced = False
        self.fault_handler: Callable[[Fault], None] = _unhandled
        #: One warning per kind of evidence the probes cannot read (see unwatched.py).
        self.unwatched = Unwatched()
        self.boundaries = Boundaries(self.ledger, lambda: self.open.written, self.unwatched.batch_failed)
        self.immediate = immediate
        self.table = ProbeTable(self.map.modules)
        self.forward = ForwardEvents(self)
        self.backward = BackwardEvents(self)
        self.optimizer = OptimizerEvents(self)
        #: step(closure): records once, after the first evaluation (closures.py).
        self.closures = ClosureSteps(self.optimizer.before_update)
        #: Which backward calls reach this model (see scope.py).
        self.reach = OptimizerReach(self.map, optimizers)
        self.scope = BackwardScope(self.backward.reached, self.reach.observe if len(optimizers) > 1 else None)
        #: What a zero_grad() cleared, also in place (cleared.py).
        self.cleared = ClearedGrads(self.map, optimizers, self.param_tensors)
        # The core probes, in ledger order (the rank agreement's core width ends after misc).
        self._forward_probe = ForwardProbe()
        for probe in (DataProbe(), self._forward_probe):
            self.add_probe(probe)
        self.loss = LossTally(self)
        self.add_probe(OutputGradProbe())
        self.norms = NormsProbe(update_every)
        self.add_probe(self.norms)
        updates = UpdateProbe(self.norms)
        self.add_probe(updates)
        #: What enters the model as data (entry.py), and, without an optimizer, each
        #: backward() as a step (stepping.py).
        self.entry = DataEntry(self, self.table)
        #: Which modules carry the forward hook on the step in progress (watching.py).
        self.watch = ModuleWatch(self.map.modules, self.forward.on_output, self.table)
        self._installed = False
        #: Submodules assigned after attach(): watched again at the next forward (replaced.py).
        self.replacements = Replacements(self.map, self.watch.rebind, self._rebound)
        self.backward_steps = BackwardSteps(self, self.table, updates)
        #: Shared core slots: the stale-gradient norm (NormsProbe) and the AMP scale (AmpTracker).
        self.misc_block = self.ledger.add_block("misc", ["stale_grad_norm", "amp_scale"])
        self.amp = AmpTracker(self)
        self.add_probe(StepProbe())
        self.rows = RowQueue(self.ledger, self.device, on_record, ring_rows, self.facts)

    # ------------------------------------------------------------------ the step in progress
    @property
    def step(self) -> int:
        """The number of the step in progress (0-based, or the framework's numbering)."""
        return self.open.meta.step

    @property
    def meta(self) -> StepMeta:
        """The host facts of the step in progress."""
        return self.open.meta

    def step_in_progress(self) -> StepMeta:
        return self.open.meta

    def _open(self, step: int, row: int) -> None:
        """A new step: every per-step state in one fresh object."""
        self.open = OpenStep(StepMeta(step=step, row=row, outgrad_complete=self.gradients.watch_all_due(step)))

    def close_row(self) -> None:
        self.flush_pending()
        meta = self.meta
        self.loss.commit()  # a row may close without a step (the AMP scaler skipped it)
        self.emit("on_row_close", meta)
        self.amp.row_closed()
        self.rows.push(meta)
        closed = meta.step
        self._open(self.numbering.following(closed), meta.row + 1)
        self.forward.end_call()
        if meta.forward_calls == 0 and meta.backward_calls:
            self.watch.dense_for_good = True  # a step without the root's forward (see watching.py)
        self._sync_watch()
        self.rows.drain()
        self.emit("on_row_closed", closed)

    def abandon_row(self) -> StepRecord:
        """The row in progress as a record, then a fresh row for the same step (cold path).

        Called when a fault raised mid-step: the step never reached ``optimizer.step()``, and a
        loop that catches the error and skips the batch must start the step again from clean
        slots (a NaN left in a slot would be charged to the next, healthy batch). The record
        holds what the aborted step saw up to the fault (``meta.partial``); its gradient norms
        were never taken, so every parameter is listed as missing.
        """
        meta = self.meta
        meta.partial = True
        meta.grad_missing = tuple(n for n, _ in self.params)
        self.drop_pending()
        record = self.rows.take(meta)
        self._open(meta.step, meta.row)
        self.forward.end_call()
        self.scope.forward_since_backward = False
        self.backward_steps.counted = False
        return record

    def start_at(self, step: int) -> None:
        """Number the next step ``step`` (a resumed run continues its numbering); before any
        step was recorded."""
        self._open(step, self.meta.row)
        self._sync_watch()

    def number_steps(self, start: int, source: Optional[Callable[[], int]] = None) -> None:
        """Number steps as the training framework does: the step in progress is ``start``;
        ``source()``, called when a row closes (inside the last optimizer's step), gives the
        number of the next one (e.g. Lightning's ``global_step + 1``). Numbers only increase."""
        self.meta.step = start
        self.numbering.source = source

    def drain(self, block: bool = False) -> None:
        """Hand on the rows that reached the host (``block``: wait for every queued row)."""
        self.rows.drain(block)

    def drain_landed(self) -> None:
        """Hand on the rows that already reached the host (never blocks)."""
        if self.rows.landed():
            self.rows.drain()

    # ------------------------------------------------------------------ set-up
    @property
    def immediate(self) -> bool:
        return self.boundaries.batch.immediate

    @immediate.setter
    def immediate(self, value: bool) -> None:
        self.boundaries.batch.immediate = value

    @property
    def update_every(self) -> int:
        return self.norms.update_every

    @update_every.setter
    def update_every(self, every: int) -> None:
        self.norms.update_every = every

    @property
    def adversarial(self) -> bool:
        """Whether some backward reached this model and another attached one, or (one sentinel
        over a container with several optimizers) one backward reached the parameters of one
        optimizer only and another those of several: a GAN's losses, which oscillate by design."""
        return self.scope.adversarial or self.reach.adversarial

    def add_probe(self, probe: Probe) -> None:
        """Set ``probe`` up and schedule the events it implements; a probe is added once."""
        self.table.add(probe, self)

    def has_probe(self, kind: type[Probe]) -> bool:
        return any(type(p) is kind for p in self.table.probes)

    def emit(self, event: str, *args: object) -> None:
        self.table.emit(self.table.subs[event], *args)

    def forward_check(self) -> Optional[Callable[..., None]]:
        return self._forward_probe.on_output if self._forward_probe in self.table.probes else None

    def install(self) -> None:
        register_params(self, self.param_tensors)
        root = self.map.root
        forward = self.forward
        self.hooks.add(root.register_forward_pre_hook(ModuleHook(raised_at_entry, forward.on_root_inputs), with_kwargs=True))
        self.hooks.add(root.register_forward_hook(ModuleHook(raised_at_entry, forward.on_root_exit), always_call=True))
        self.entry.install(root)
        # Process-wide, held weakly: sees `model.head = nn.Linear(...)` when it happens.
        self.hooks.add(nn.modules.module.register_module_module_registration_hook(
            WeakHook(self.replacements.note)))
        self._installed = True
        self._sync_watch()
        for opt in self.optimizers:
            # Weakly: an optimizer the user keeps must not keep the collector (and the model).
            self.hooks.add(opt.register_step_pre_hook(WeakHook(self.optimizer.on_pre_step)))
            self.hooks.add(opt.register_step_post_hook(WeakHook(self.optimizer.on_post_step)))
        leave_hooks_out_of_copies(self.hooks)
        # No public hook exists for these: see events_backward.py and events_optimizer.py.
        self.hooks.subscribe(patch_for(torch.autograd, "backward"), BackwardListener(self.backward))
        zeroing = ZeroGradListener(self.backward)
        self.hooks.subscribe(patch_for(nn.Module, "zero_grad"), zeroing)
        self.hooks.subscribe(patch_for(torch.optim.Optimizer, "zero_grad"), zeroing)
        scaler_cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler_cls is not None:
            self.hooks.subscribe(patch_for(scaler_cls, "scale"), ScaleListener(self.backward))
            self.hooks.subscribe(patch_for(scaler_cls, "step"), ScalerStepListener(self.optimizer))

    def close(self) -> None:
        self.disabled = True
        self.scope.closed = True
        unregister_params(self)
        self.forward.close()
        self.drop_pending()
        try:
            self.watch.close()
            self.entry.close()
            self.hooks.close()
        finally:
            self.table.close()

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

    def _rebound(self, name: str, old: nn.Module, new: nn.Module) -> None:
        self.table.rebind(old, new)
        if "." not in name:
            self.entry.watch(old, new)  # a top-level submodule: data may enter there

    # ------------------------------------------------------------------ what the user calls
    def observe_loss(self, loss: torch.Tensor) -> None:
        self.loss.observe_loss(loss)

    def observe_validation(self, loss: Any) -> None:
        self.loss.observe_validation(loss)

    def take_pending_validation(self) -> Optional[StepRecord]:
        return self.loss.take_pending_validation()

    def quiet(self) -> Any:
        """A context in which the module hooks record nothing (another component reruns the
        forward; see ``ForwardEvents.quiet``)."""
        return self.forward.quiet()

    # ------------------------------------------------------------------ for probes
    def on_fault(self, fault: Fault) -> None:
        """A probe found a non-finite value in immediate mode: the sentinel's policy decides."""
        self.forward.fault_seen(fault)
        self.fault_handler(fault)

    @property
    def fully_watched(self) -> bool:
        return self.watch.everything

    @property
    def rerunning(self) -> bool:
        return self.forward.rerunning

    @property
    def stepped_optimizers(self) -> set[int]:
        return self.open.stepped

    def forward_order(self) -> list[int]:
        return self.forward.forward_order()

    def forward_rng(self) -> RngState:
        return self.forward.forward_rng()

    def rerun_forward(self) -> str:
        return self.forward.rerun_forward()

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
        self.boundaries.reduce_into(t, lo, hi, compiling, probe)

    def flush_at_boundaries(self, pending: Pending) -> None:
        self.boundaries.hold(pending)

    def reduce_later(self, t: torch.Tensor, lo: int, hi: int, probe: str, on_bad: Optional[OnBad] = None) -> None:
        self.boundaries.reduce_later(t, lo, hi, probe, on_bad)

    def fraction_later(self, t: torch.Tensor, slot: int, shift: float, edge: float) -> None:
        self.boundaries.fraction_later(t, slot, shift, edge)

    def flush_pending(self) -> None:
        self.boundaries.flush()

    def drop_pending(self) -> None:
        self.boundaries.drop()


def _unhandled(fault: Fault) -> None:
    raise SentinelError(f"non-finite value at step {fault.step} ({fault.boundary}, {fault.module})")

