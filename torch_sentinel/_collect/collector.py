"""The hooks: every place the sentinel looks, reduced into ledger slots on the device.

Hot-path rules, enforced by the sync-audit tests:
- a hook only launches tensor ops whose results stay on the device (``aminmax`` into slots,
  ``_foreach_norm`` over all parameters at once);
- a hook never reads a device value, except in immediate mode, where on CPU the read is a numpy
  view of the row (a memory load, no torch op) and on accelerators goes through ``read_now``;
- host facts (step counts, shapes, backward order) are plain Python bookkeeping.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch import nn

from .compat import is_compiling as _is_compiling
from .hookset import HookSet
from .ledger import FLOAT_MAX, Ledger
from .model_map import ModelMap
from .patches import patch_for
from .records import StepMeta, StepRecord, TensorEvidence
from .shards import ShardedNorms, local
from .transfer import HostRing, read_now

__all__ = ["DATA_SHAPE_KEYS", "Collector", "Fault", "iter_tensors", "tensor_evidence", "weight_fault"]

#: meta.shapes keys of the main and the extra model inputs (module slots are >= 0).
DATA_SHAPE_KEYS = (-1, -2)



def iter_tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Tensors inside a module's output: tensors, tuples, lists, dicts and ``ModelOutput``s."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 4:
        if isinstance(obj, (list, tuple)):
            for item in obj:
                yield from iter_tensors(item, depth + 1)
        elif isinstance(obj, Mapping):
            for item in obj.values():
                yield from iter_tensors(item, depth + 1)


#: Modules that cannot turn finite inputs into non-finite outputs: activations, dropout,
#: pooling, reshapes. A non-finite value at their output was already non-finite at their input,
#: where the module that produced it is checked, so reducing their outputs again would only cost
#: bandwidth (on a CNN, half of all forward activation passes). Their output *gradients* are
#: still checked: they carry what the next module's backward produced.
VALUE_PRESERVING: tuple[type[nn.Module], ...] = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.RReLU, nn.ELU, nn.CELU, nn.SELU, nn.GELU, nn.SiLU,
    nn.Mish, nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid, nn.Sigmoid, nn.Tanh, nn.Softsign,
    nn.LogSigmoid, nn.Softplus, nn.Softmax, nn.LogSoftmax,
    nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout,
    nn.Identity, nn.Flatten, nn.Unflatten, nn.PixelShuffle, nn.PixelUnshuffle,
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
)


#: Parameter copies for exact update norms are kept between sampled steps up to this size.
KEEP_UPDATE_COPY_BYTES = 256 << 20

#: Layers whose backward turns a finite incoming gradient into a finite one, given finite
#: inputs and weights (norms have eps > 0). See ``Collector._plan_gradient_watch``.
STANDARD_LAYERS: tuple[type[nn.Module], ...] = (
    *VALUE_PRESERVING,
    nn.Linear, nn.Bilinear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
    nn.ConvTranspose3d, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm,
    nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d, nn.Embedding,
)


def _reducible(t: torch.Tensor) -> bool:
    return t.is_floating_point() and not t.is_meta and not t.is_sparse and t.numel() > 0


def tensor_evidence(t: torch.Tensor) -> TensorEvidence:
    """Exact counts for an offending tensor. Cold path: reads the device."""
    d = t.detach()
    finite = torch.isfinite(d)
    ev = TensorEvidence(shape=tuple(d.shape), dtype=str(d.dtype).replace("torch.", ""))
    ev.nan = int(read_now(torch.isnan(d).sum()))
    ev.posinf = int(read_now((d == math.inf).sum()))
    ev.neginf = int(read_now((d == -math.inf).sum()))
    if bool(read_now(finite.any())):
        vals = d[finite]
        ev.min = read_now(vals.min())
        ev.max = read_now(vals.max())
    return ev


class Fault:
    """A hook found a non-finite value in immediate mode; the Sentinel applies the policy."""

    __slots__ = ("boundary", "detail", "evidence", "module", "step")

    def __init__(
        self,
        step: int,
        boundary: str,
        module: Optional[str],
        evidence: TensorEvidence,
        detail: dict[str, Any],
    ) -> None:
        self.step = step
        self.boundary = boundary
        self.module = module
        self.evidence = evidence
        self.detail = detail


def weight_fault(step: int, module: Optional[str], parameter: str, norm: Optional[float]) -> Fault:
    """Weights found non-finite at the start of ``step``: the update of the step before made
    them (at step 0: the initial weights, or a checkpoint, were already non-finite)."""
    detail: dict[str, Any] = {"present": "non-finite parameter after the optimizer step", "parameter": parameter}
    if norm is not None:
        detail["param_norm"] = norm
    if step == 0:
        detail["present"] = "non-finite parameter before the first step (initialisation or checkpoint)"
    return Fault(max(step - 1, 0), "updates", module, TensorEvidence(), detail)



class _LossListener:
    """Sees ``torch.autograd.backward`` (hence ``loss.backward()``) while attached."""

    def __init__(self, collector: Collector) -> None:
        self._collector = weakref.ref(collector)

    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        c = self._collector()
        if c is not None:
            tensors = args[0] if args else kwargs.get("tensors")
            c.before_backward(tensors)

    def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        return None


class _ScaleListener:
    """Sees ``GradScaler.scale(loss)`` so the recorded loss is the unscaled one."""

    def __init__(self, collector: Collector) -> None:
        self._collector = weakref.ref(collector)

    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        return None

    def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        c = self._collector()
        if c is not None and len(args) >= 2:
            c.on_scale(args[0], args[1], result)


class _ScalerStepListener:
    """Sees ``GradScaler.step(optimizer)``: a step the scaler skips never reaches the optimizer."""

    def __init__(self, collector: Collector) -> None:
        self._collector = weakref.ref(collector)

    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        c = self._collector()
        if c is not None and len(args) >= 2:
            c.before_scaler_step(args[0], args[1])

    def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        c = self._collector()
        if c is not None and len(args) >= 2:
            c.after_scaler_step(args[0], args[1])


class Collector:
    """Installs every hook and owns the ledger and the host ring.

    ``on_record(record)`` is called on the training thread for each step whose row reached the
    host; ``immediate`` selects whether hooks check their own slot on the spot.
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
    ) -> None:
        self.model = model
        self.map = ModelMap(model)
        self.optimizers = optimizers
        self.immediate = immediate
        self.update_every = update_every
        self.on_record = on_record
        self.hooks = HookSet()
        self.step = 0
        self.device = self._pick_device()
        self.ledger = Ledger(self.device)
        self._install_layout()
        self.ring = HostRing(self.device, self.ledger.current.numel(), rows=ring_rows)
        self.meta = StepMeta(step=0, outgrad_complete=True)
        #: The output most recently reduced in this forward: a container (or Identity) returning
        #: it as is must not reduce it, or hook its gradient, a second time. Dropped when the
        #: root's forward completes, so no activation outlives its forward.
        self._last_output: Optional[torch.Tensor] = None
        self._forward_seq: dict[int, int] = {}
        self._pending_scaled: Optional[tuple[weakref.ref[torch.Tensor], torch.Tensor, Any]] = None
        self._forward_since_backward = False
        self._scaler_depth = 0
        self._stepped_in_scaler = False
        self._optimizers_stepped: set[int] = set()
        self._shadow: Optional[list[torch.Tensor]] = None
        self._kept_shadow: Optional[list[torch.Tensor]] = None
        self._missing_index_cache: dict[tuple[int, ...], torch.Tensor] = {}
        #: Extension points for detectors' device-side statistics (all called in existing hooks).
        self.input_taps: list[Callable[[torch.Tensor], None]] = []
        #: Called with the root module's (args, kwargs) at each training forward (host refs only).
        self.root_input_taps: list[Callable[[tuple[Any, ...], dict[str, Any]], None]] = []
        self.output_taps: dict[int, list[Callable[[nn.Module, torch.Tensor], None]]] = {}
        self.step_taps: list[Callable[[Collector], None]] = []
        self.backward_taps: list[Callable[[Collector, torch.Tensor], None]] = []
        self.row_taps: list[Callable[[StepMeta], None]] = []
        #: Called with the closed step at the end of close_row, after its landed rows were
        #: handed on: the point every rank reaches once per step (cross-rank decisions).
        self.closed_taps: list[Callable[[int], None]] = []
        self.disabled = False
        self.on_fault: Callable[[Fault], None] = _unhandled

    # ------------------------------------------------------------------ set-up
    def _pick_device(self) -> torch.device:
        for _, p in self.map.params:
            if p.device.type != "meta":
                return p.device
        for _, b in self.map.root.named_buffers():
            return b.device
        return torch.device("cpu")

    def _trainable_params(self) -> list[tuple[str, torch.Tensor]]:
        """Model parameters plus any optimizer parameter that is not in the model."""
        params: list[tuple[str, torch.Tensor]] = list(self.map.params)
        seen = {id(p) for _, p in params}
        for oi, opt in enumerate(self.optimizers):
            for gi, group in enumerate(opt.param_groups):
                for pi, p in enumerate(group["params"]):
                    if id(p) not in seen:
                        seen.add(id(p))
                        params.append((f"<optimizer{oi}>.param_groups[{gi}][{pi}]", p))
        return params

    def _install_layout(self) -> None:
        L = self.ledger
        names = [n for n, _ in self.map.modules]
        self.params = self._trainable_params()
        self.param_tensors = [p for _, p in self.params]
        pnames = [n for n, _ in self.params]
        self.data_lo, self.data_hi = L.add_minmax_block("data", ["inputs", "aux"])
        self.act_lo, self.act_hi = L.add_minmax_block("act", names)
        self.loss_block = L.add_block("loss", ["auto", "explicit", "validation"])
        self.og_lo, self.og_hi = L.add_minmax_block("outgrad", names)
        self.grad_block = L.add_block("grad_norm", pnames)
        # Right after grad_norm: _record_norms fills both blocks with one _foreach_norm.
        self.param_block = L.add_block("param_norm", pnames)
        assert self.param_block.start == self.grad_block.stop
        self.update_block = L.add_block("update_norm", pnames)
        self.misc_block = L.add_block("misc", ["stale_grad_norm", "amp_scale"])
        self._checked = [not isinstance(m, VALUE_PRESERVING) for _, m in self.map.modules]
        self._standard = [isinstance(m, STANDARD_LAYERS) for _, m in self.map.modules]
        self._is_leaf = [next(iter(m.children()), None) is None for _, m in self.map.modules]
        #: Whether each module's output gradient is reduced (see _plan_gradient_watch).
        self._watch_grad = [True] * len(self.map.modules)
        self._grad_hooks = [functools.partial(self._on_output_grad, i) for i in range(len(names))]
        self._grad_prehooks = [functools.partial(self._on_node_grads, i, 0) for i in range(len(names))]
        #: Slot pairs already written in this step (the rest still hold their initial values).
        self._written: set[int] = set()
        #: Set once a hook was traced by torch.compile: its host checks never run.
        self._traced = False
        self.module_names = names
        self._same_device = all(p.device == self.device for p in self.param_tensors)
        self._sharded = ShardedNorms(self.param_tensors)
        self._sharded_pairs = ShardedNorms(self.param_tensors + self.param_tensors)
        total_bytes = sum(p.numel() * p.element_size() for p in self.param_tensors)
        self.update_copy_bytes = total_bytes

    def install(self) -> None:
        root = self.map.root
        self.hooks.add(root.register_forward_pre_hook(self._on_root_inputs, with_kwargs=True))
        for i, (_, module) in enumerate(self.map.modules):
            self.hooks.add(module.register_forward_hook(functools.partial(self._on_output, i)))
        for opt in self.optimizers:
            self.hooks.add(opt.register_step_pre_hook(self._on_pre_step))
            self.hooks.add(opt.register_step_post_hook(self._on_post_step))
        self.hooks.subscribe(patch_for(torch.autograd, "backward"), _LossListener(self))
        scaler_cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler_cls is not None:
            self.hooks.subscribe(patch_for(scaler_cls, "scale"), _ScaleListener(self))
            self.hooks.subscribe(patch_for(scaler_cls, "step"), _ScalerStepListener(self))

    def close(self) -> None:
        self.disabled = True
        self._pending_scaled = None
        self._shadow = None
        self._kept_shadow = None
        self._last_output = None
        self.hooks.close()

    # ------------------------------------------------------------------ checks
    def _host_value(self, i: int) -> float:
        hv = self.ledger.host_view
        return float(hv[i]) if hv is not None else read_now(self.ledger.views[i])

    def _finite(self, i: int) -> bool:
        return math.isfinite(self._host_value(i))

    def _reduce_into(self, t: torch.Tensor, lo: int, hi: int, compiling: bool = False) -> None:
        """Fold ``t``'s min and max into the slot pair ``(lo, hi)``, on the device.

        The first write of a pair in a step is a single ``aminmax(out=...)``; later writes (a
        module called twice, gradient accumulation) fold with ``minimum``/``maximum``. Which is
        which is host bookkeeping, skipped while tracing under torch.compile.
        """
        views = self.ledger.views
        d = t.detach()
        if not compiling and d.dtype is torch.float32 and lo not in self._written:
            self._written.add(lo)
            torch.aminmax(d, out=(views[lo], views[hi]))
            return
        mn, mx = torch.aminmax(d)
        torch.minimum(views[lo], mn, out=views[lo])
        torch.maximum(views[hi], mx, out=views[hi])

    # ------------------------------------------------------------------ data
    def _on_root_inputs(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self.disabled or not torch.is_grad_enabled():
            return None
        compiling = _is_compiling()
        if not compiling and self.ring.head > self.ring.tail:
            self.drain()
        self.meta.forward_calls += 1
        for root_tap in self.root_input_taps:
            root_tap(args, kwargs)
        first = True
        for t in iter_tensors(args):
            if not _reducible(t):
                continue
            self._reduce_data(t, main=first, compiling=compiling, name=None)
            first = False
        for key, value in kwargs.items():
            for t in iter_tensors(value):
                if not _reducible(t):
                    continue
                # A 0-d tensor is a count or a flag (the HF Trainer's num_items_in_batch), not the batch.
                main = first and "mask" not in key and t.dim() > 0
                self._reduce_data(t, main=main, compiling=compiling, name=key)
                first = first and not main
        return None

    def _reduce_data(self, t: torch.Tensor, *, main: bool, compiling: bool, name: Optional[str]) -> None:
        k = 0 if main else 1
        lo, hi = self.data_lo.start + k, self.data_hi.start + k
        self._reduce_into(t, lo, hi, compiling)
        if not compiling:
            self.meta.shapes[DATA_SHAPE_KEYS[k]] = (t.shape, t.dtype)
        if main:
            for tap in self.input_taps:
                tap(t.detach())
        if self.immediate and not compiling:
            # Additive masks legitimately hold -inf, so only the main input must be free of it.
            low = self._host_value(lo)
            bad = not self._finite(hi) or math.isnan(low) or (main and math.isinf(low))
            if bad:
                self.on_fault(
                    Fault(
                        self.step,
                        "data",
                        None,
                        tensor_evidence(t),
                        {"input": name or ("args[0]" if main else "extra input")},
                    )
                )

    # ------------------------------------------------------------------ forward
    def _on_output(self, slot: int, module: nn.Module, args: Any, output: Any) -> None:
        if self.disabled or not torch.is_grad_enabled():
            return None
        compiling = _is_compiling()
        self._forward_since_backward = True
        taps = self.output_taps.get(id(module))
        checked = self._checked[slot]
        lo = self.act_lo.start + slot
        hi = self.act_hi.start + slot
        for t in (output,) if type(output) is torch.Tensor else iter_tensors(output):
            if not _reducible(t):
                continue
            if taps:
                for tap in taps:
                    tap(module, t)
            if compiling:
                self._traced = True  # runs once, while tracing: host checks are off from now on
                if checked:
                    self._reduce_into(t, lo, hi, compiling=True)
                continue
            if t is self._last_output:
                continue  # a submodule's output returned as is: already reduced and hooked
            self._last_output = t
            if t.requires_grad and (self._watch_grad[slot] or self.meta.outgrad_complete):
                self._watch_gradient(t, slot)
            if not checked:
                continue
            self._reduce_into(t, lo, hi)
            self.meta.shapes[slot] = (t.shape, t.dtype)  # formatted only when a fault is reported
            if self.immediate and not (self._finite(lo) and self._finite(hi)):
                self._forward_fault(slot, module, args, t)
        if not compiling and slot not in self._forward_seq:
            self._forward_seq[slot] = len(self._forward_seq)
            if slot == 0:  # the root completes last: the first forward's order is known
                self._plan_gradient_watch()
        if slot == 0:
            self._last_output = None
        return None

    def _watch_gradient(self, t: torch.Tensor, slot: int) -> None:
        """Reduce the gradient that will arrive at ``t`` in backward.

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

    def _watch_all_due(self) -> bool:
        """Every output gradient is reduced on the first ten steps and every tenth after: the
        gradient-scale detectors compare the signal across all layers on those steps."""
        return self.step < 10 or self.step % 10 == 0

    def _plan_gradient_watch(self) -> None:
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
        leaves = [s for s in sorted(self._forward_seq, key=self._forward_seq.__getitem__) if self._is_leaf[s]]
        for here, after in zip(leaves, leaves[1:]):
            if self._standard[here] and self._standard[after]:
                self._watch_grad[here] = False

    def forward_order(self) -> list[int]:
        """Module slots in the order they first completed a forward pass."""
        seen = sorted(self._forward_seq, key=self._forward_seq.__getitem__)
        rest = [i for i in range(len(self.module_names)) if i not in self._forward_seq]
        return seen + rest

    def _forward_fault(self, slot: int, module: nn.Module, args: Any, t: torch.Tensor) -> None:
        name = self.module_names[slot]
        for pname, p in module.named_parameters(recurse=False):
            if not bool(read_now(torch.isfinite(p.detach()).all())):
                # Finite inputs, non-finite weights: the previous optimizer step made them.
                qual = f"{name}.{pname}" if name else pname
                self.on_fault(weight_fault(self.step, name, qual, None))
                return
        inputs_finite = True
        for a in iter_tensors(args):
            if _reducible(a) and not bool(read_now(torch.isfinite(a.detach()).all())):
                inputs_finite = False
                break
        detail: dict[str, Any] = {"module_type": type(module).__name__, "inputs_finite": inputs_finite}
        if not inputs_finite:
            # The input went bad in functional code between submodules: blame the caller.
            detail["first_nonfinite_output_of"] = name
            name = name.rpartition(".")[0] if name else name
        self.on_fault(Fault(self.step, "forward", name, tensor_evidence(t), detail))

    # ------------------------------------------------------------------ loss
    def on_scale(self, scaler: Any, outputs: Any, result: Any) -> None:
        if self.disabled or not isinstance(outputs, torch.Tensor) or not isinstance(result, torch.Tensor):
            return
        enabled = getattr(scaler, "is_enabled", lambda: True)()
        if enabled:
            self._pending_scaled = (weakref.ref(result), outputs, scaler)

    def before_backward(self, tensors: Any) -> None:
        if self.disabled:
            return
        if isinstance(tensors, (list, tuple)):
            if len(tensors) != 1:
                return
            tensors = tensors[0]
        if not isinstance(tensors, torch.Tensor) or tensors.numel() != 1 or not tensors.requires_grad:
            return
        if not self._forward_since_backward:
            return  # a backward that did not go through the attached model
        self._forward_since_backward = False
        loss = tensors
        pending = self._pending_scaled
        if pending is not None and pending[0]() is tensors:
            loss = pending[1]
            self.meta.amp = True
            scale = getattr(pending[2], "_scale", None)
            if isinstance(scale, torch.Tensor):
                self.ledger.views[self.misc_block.start + 1].copy_(scale.detach().reshape(()))
            self._pending_scaled = None
        if self.meta.backward_calls == 0:
            self._check_stale_grads()
        self.meta.backward_calls += 1
        i = self.loss_block.start
        self.ledger.views[i].add_(loss.detach().reshape(()).float())
        for tap in self.backward_taps:
            tap(self, loss)
        if self.immediate and not self.meta.loss_explicit and not self._finite(i):
            self.on_fault(Fault(self.step, "loss", None, tensor_evidence(loss), {}))

    def observe_loss(self, loss: torch.Tensor) -> None:
        i = self.loss_block.start + 1
        self.ledger.views[i].add_(loss.detach().reshape(()).float())
        self.meta.loss_explicit = True
        if self.immediate and not self._finite(i):
            self.on_fault(Fault(self.step, "loss", None, tensor_evidence(loss), {"explicit": True}))

    def observe_validation(self, loss: Any) -> None:
        if isinstance(loss, torch.Tensor):
            self.ledger.views[self.loss_block.start + 2].copy_(loss.detach().reshape(()).float())
            self.meta.validation_on_device = True
        else:
            self.meta.validation = float(loss)
            self.meta.validation_on_device = False

    def take_pending_validation(self) -> Optional[StepRecord]:
        """A validation loss observed after the last optimizer step, as a record of its own.

        Its row has not closed (no step followed it), so it would never reach the host. Cold
        path (flush, detach): the record carries only the validation value, with this step's
        number; the row in progress keeps its other evidence.
        """
        meta = self.meta
        if meta.validation is None and not meta.validation_on_device:
            return None
        slot = self.loss_block.start + 2
        values = self.ledger.initial_row()
        if meta.validation_on_device:
            values[slot] = read_now(self.ledger.views[slot])
        record = StepRecord(
            StepMeta(step=meta.step, validation=meta.validation, validation_on_device=meta.validation_on_device),
            values,
            self.ledger.blocks,
        )
        meta.validation, meta.validation_on_device = None, False
        return record

    def _check_stale_grads(self) -> None:
        """Gradients already present before a step's first backward were not cleared."""
        # Local shards of sharded gradients: finiteness is what matters here, not the global norm.
        stale = [local(p.grad) for p in self.param_tensors if p.grad is not None]
        self.meta.stale_grads = len(stale)
        if stale and self.step > 0:
            with torch.no_grad():
                norms = torch._foreach_norm(stale)
                total = torch.linalg.vector_norm(torch.stack([n.to(self.device) for n in norms]))
                self.ledger.views[self.misc_block.start].copy_(total)

    # ------------------------------------------------------------------ backward
    def _on_output_grad(self, slot: int, grad: Optional[torch.Tensor]) -> None:
        if self.disabled or grad is None or not _reducible(grad):
            return None
        lo = self.og_lo.start + slot
        hi = self.og_hi.start + slot
        self._reduce_into(grad, lo, hi)
        order = self.meta.bwd_order
        previous = order[-1] if order else None
        order.append(slot)
        if self.immediate and not self.meta.amp and not (self._finite(lo) and self._finite(hi)):
            if previous is None:
                culprit: Optional[str] = None
                detail = {"incoming_to": self.module_names[slot], "source": "loss backward"}
            else:
                culprit = self.module_names[previous]
                detail = {"incoming_to": self.module_names[slot], "source": "module backward"}
            self.on_fault(Fault(self.step, "gradients", culprit, tensor_evidence(grad), detail))
        return None

    # ------------------------------------------------------------------ optimizer
    def before_scaler_step(self, scaler: Any, optimizer: Any) -> None:
        if optimizer in self.optimizers:
            self._scaler_depth += 1
            self._stepped_in_scaler = False

    def after_scaler_step(self, scaler: Any, optimizer: Any) -> None:
        if optimizer not in self.optimizers:
            return
        self._scaler_depth -= 1
        enabled = getattr(scaler, "is_enabled", lambda: True)()
        if enabled and not self._stepped_in_scaler:
            # The scaler found inf/NaN in the scaled gradients and skipped optimizer.step().
            self.meta.amp = True
            self.meta.amp_skipped = True
            self.close_row()

    def _on_pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> Optional[tuple[Any, Any]]:
        if self.disabled:
            return None
        if self.ring.head > self.ring.tail:
            self.drain()
        closure = kwargs.get("closure") if kwargs else None
        in_kwargs = closure is not None
        if closure is None and args and callable(args[0]):
            closure = args[0]
        if closure is not None:
            # step(closure) (Lightning, LBFGS) runs forward and backward inside step(): the
            # gradients exist only once the closure returned, so record them there.
            def recorded_closure() -> Any:
                result = closure()
                self._before_update(optimizer)
                return result

            if in_kwargs:
                return args, {**kwargs, "closure": recorded_closure}
            return (recorded_closure, *args[1:]), kwargs
        self._before_update(optimizer)
        return None

    def _before_update(self, optimizer: Any) -> None:
        with torch.no_grad():
            self._record_norms()
            for tap in self.step_taps:
                tap(self)
            if self.update_every and self.step % self.update_every == 0 and id(optimizer) not in self._optimizers_stepped:
                tensors = [p.detach() for p in self.param_tensors]
                self._shadow = self._copy_of(tensors) if tensors else None

    def _copy_of(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """The weights before the update, for the exact ||dW|| of a sampled step.

        Small models reuse one set of buffers (fresh allocations of a few MB cost page faults on
        every sampled step); above ``KEEP_UPDATE_COPY_BYTES`` the copy is made and dropped each
        time, so the memory is held only between the pre- and post-step hooks.
        """
        kept = self._kept_shadow
        if kept is not None and len(kept) == len(tensors) and all(
            k.shape == t.shape and k.dtype == t.dtype and k.device == t.device for k, t in zip(kept, tensors)
        ):
            torch._foreach_copy_(kept, tensors)
            return kept
        return list(torch._foreach_mul(tensors, 1.0))

    def _record_norms(self) -> None:
        """Gradient and weight norms of every parameter, before the update, in one _foreach_norm.

        The weights before step k are the weights after step k-1 (nothing else runs between the
        optimizer steps of a healthy loop), so one pass serves the gradient and the update
        boundaries; a non-finite weight here is charged to the update of the previous step.
        """
        grads = [p.grad for p in self.param_tensors]
        if self._weights_due():
            weights: list[Optional[torch.Tensor]] = [p.detach() for p in self.param_tensors]
            missing = self._copy_norms(self.grad_block.start, grads + weights, self._sharded_pairs)
            self.meta.weights_recorded = True
        else:
            missing = self._copy_norms(self.grad_block.start, grads, self._sharded)
        self.meta.grad_missing = tuple(self.params[i][0] for i in missing)
        self.meta.frozen = tuple(n for n, p in self.params if not p.requires_grad)

    def _weights_due(self) -> bool:
        """Whether this step reads every weight for its norm.

        Deferred mode needs them every step: the row is the only evidence that an update made
        a weight non-finite. Immediate mode finds that exactly without them: the first forward
        that uses such a weight goes non-finite, and its hook checks that module's weights on
        the spot (``_forward_fault``). There they are read on the first ten steps, then on
        pairs of consecutive steps every ten (what ``no_update`` compares), and with every
        sampled update: a pass over all weights saved on four steps in five.
        """
        if not self.immediate or self._traced:
            return True
        step = self.step
        return step < 10 or step % 10 in (0, 1) or bool(self.update_every and step % self.update_every == 0)

    def _copy_norms(
        self, block_start: int, tensors: list[Optional[torch.Tensor]], sharded: ShardedNorms
    ) -> list[int]:
        """L2 norms of ``tensors`` into consecutive slots from ``block_start``; the indices of
        the tensors that are None (their slots are left alone) are returned."""
        n = len(tensors)
        present = [i for i, t in enumerate(tensors) if t is not None]
        if not present:
            return list(range(n))
        if sharded:
            tensors = [None if t is None else local(t) for t in tensors]
        norms = list(torch._foreach_norm([tensors[i] for i in present]))  # type: ignore[misc]
        if not self._same_device:
            norms = [t.to(self.device) for t in norms]
        stacked = sharded.globalize(torch.stack(norms).float(), present)
        dest = self.ledger.current[block_start : block_start + n]
        if len(present) == n:
            dest.copy_(stacked)
        else:
            key = tuple(present)
            index = self._missing_index_cache.get(key)
            if index is None:
                index = torch.tensor(present, device=self.device)
                self._missing_index_cache = {key: index}
            dest.index_copy_(0, index, stacked)
        if self.ledger.host_view is not None:
            self._confirm_norm_overflow(block_start, tensors)
        return [i for i in range(n) if tensors[i] is None]

    def _confirm_norm_overflow(self, start: int, tensors: list[Optional[torch.Tensor]]) -> None:
        """An L2 norm of +inf may be float32 overflow of finite values (|x| > ~1e19): confirm
        exactly, while the tensors are still live, before the row can claim a non-finite value.

        Only where the row is host memory (CPU), so the look is a memory load; the exact check
        runs only when a norm is +inf (cold path). On accelerators in deferred mode the
        detectors treat a +inf norm without NaN as an overflow instead.
        """
        hv = self.ledger.host_view
        assert hv is not None
        row = hv[start : start + len(tensors)]
        for i in np.flatnonzero(np.isposinf(row)).tolist():
            t = tensors[i]
            if t is not None and bool(read_now(torch.isfinite(t).all())):
                row[i] = FLOAT_MAX
                name = self.params[i % len(self.params)][0]
                if name not in self.meta.norm_overflow:  # gradient and weight: once each
                    self.meta.norm_overflow.append(name)

    def _on_post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.disabled:
            return
        if self._scaler_depth:
            self._stepped_in_scaler = True
        if self._shadow is not None:
            with torch.no_grad():
                torch._foreach_sub_(self._shadow, [p.detach() for p in self.param_tensors])
                self._copy_norms(self.update_block.start, list(self._shadow), self._sharded)
            # DTensor has no _foreach_copy_: sharded models copy afresh.
            keep = self.update_copy_bytes <= KEEP_UPDATE_COPY_BYTES and not self._sharded
            self._kept_shadow = self._shadow if keep else None
            self._shadow = None
            self.meta.updates_sampled = True
        self.meta.lrs.extend(_lr(g) for g in optimizer.param_groups)
        self.meta.lr_names.extend(
            str(g.get("name", f"group{i}")) if len(self.optimizers) == 1 else f"opt{self.optimizers.index(optimizer)}.{g.get('name', f'group{i}')}"
            for i, g in enumerate(optimizer.param_groups)
        )
        if id(optimizer) in self._optimizers_stepped:
            # This optimizer stepped twice in one row (e.g. several critic steps per generator
            # step): the previous row is complete.
            self.close_row()
        self._optimizers_stepped.add(id(optimizer))
        if len(self._optimizers_stepped) >= len(self.optimizers):
            self.close_row()

    # ------------------------------------------------------------------ rows
    def close_row(self) -> None:
        meta = self.meta
        for tap in self.row_taps:
            tap(meta)
        if self.ledger.current.numel() > self.ring.width:
            # The row grew since the ring was sized (a detector's block added at attach, or a
            # module first called late): hand over the narrower rows, then widen the ring.
            self.drain(block=True)
        self.ring.push(self.ledger.current, meta)
        self.ledger.reset()
        self.step += 1
        self.meta = StepMeta(step=self.step, outgrad_complete=self._watch_all_due())
        self._last_output = None
        self._written = set()
        self._optimizers_stepped = set()
        self._pending_scaled = None
        self.drain()
        for closed_tap in self.closed_taps:
            closed_tap(self.step - 1)

    def drain(self, block: bool = False) -> None:
        if self.ledger.current.numel() > self.ring.width:
            block = True  # the row grew; older rows are narrower but still valid
        for meta, values in self.ring.drain(block=block):
            self.on_record(StepRecord(meta, values, self.ledger.blocks))
        if self.ledger.current.numel() > self.ring.width and self.ring.pending() == 0:
            self.ring = HostRing(self.device, self.ledger.current.numel(), rows=self.ring.rows)


def _lr(group: Mapping[str, Any]) -> Optional[float]:
    lr = group.get("lr")
    if isinstance(lr, torch.Tensor):
        return None  # a tensor lr would need a device read; it is not logged
    return float(lr) if lr is not None else None


def _unhandled(fault: Fault) -> None:
    raise RuntimeError(f"non-finite value at step {fault.step} ({fault.boundary}, {fault.module})")
