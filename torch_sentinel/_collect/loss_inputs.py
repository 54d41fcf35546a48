"""What the loss function was given: shapes (host facts) and a probability probe (device).

``torch.nn.functional`` losses are observed through the shared function patches; the
``nn.*Loss`` modules call them, so both spellings are seen. Only training calls count (grad
enabled, input requiring grad): a validation loss under ``no_grad`` is not a training fault.

Per sampled step the probe reduces, on the device, the input's min and max and the largest
deviation of a row sum (over the class dim) from 1 into ledger slots: a tensor of non-negative
rows that sum to 1 is a probability distribution, not logits.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any, ClassVar, Optional

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from .cadence import sampled
from .compat import is_compiling as _is_compiling
from .patches import patch_for
from .probe import Probe, ProbeHost

__all__ = ["BROADCAST_LOSSES", "LOGIT_LOSSES", "BroadcastEvent", "LossInputs", "forward_site"]


#: Element-wise losses that broadcast a mismatched target instead of refusing it.
BROADCAST_LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
#: Losses that expect logits (or log-probabilities, for nll_loss) along dim 1.
LOGIT_LOSSES = ("cross_entropy", "nll_loss", "binary_cross_entropy_with_logits")

_PROB_MODULES = (nn.Softmax, nn.Sigmoid, nn.Softmax2d)


class BroadcastEvent:
    __slots__ = ("broadcast_shape", "function", "input_shape", "step", "target_shape")

    def __init__(self, step: int, function: str, input_shape: tuple[int, ...], target_shape: tuple[int, ...],
                 broadcast_shape: tuple[int, ...]) -> None:
        self.step = step
        self.function = function
        self.input_shape = input_shape
        self.target_shape = target_shape
        self.broadcast_shape = broadcast_shape


class _Listener:
    def __init__(self, owner: LossInputs, function: str) -> None:
        self.owner = owner
        self.function = function

    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.owner.on_loss(self.function, args, kwargs)

    def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        return None


def forward_site(module: nn.Module) -> str:
    """``Class.forward (file.py:line)`` of a module's forward, where its functional calls are."""
    fn = type(module).forward
    try:
        return f"{type(module).__name__}.forward ({inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]})"
    except (OSError, TypeError):
        return f"{type(module).__name__}.forward"


class LossInputs(Probe):
    """Shared by the loss-side detectors: one instance per run, kept in ``RunContext.extras``."""

    name = "loss_inputs"
    live_attributes: ClassVar[frozenset[str]] = frozenset(
        {"probe_first", "probe_every", "_prob_outputs", "_slots", "_names"})

    def __init__(self, probe_first: int = 5, probe_every: int = 10) -> None:
        self.probe_first = probe_first
        self.probe_every = probe_every
        self.broadcasts: list[BroadcastEvent] = []
        #: Classes seen by cross_entropy / nll_loss (for "stuck at chance level").
        self.classes: Optional[int] = None
        self.host: Optional[ProbeHost] = None
        self._prob_outputs: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._slots: tuple[int, int, int] = (0, 0, 0)
        #: Training calls of the watched loss functions seen outside compiled code.
        self.eager_calls = 0
        #: A loss reaching backward was the output of a compiled graph.
        self.compiled_loss = False

    @classmethod
    def shared(cls, extras: dict[str, Any]) -> LossInputs:
        """The run's one instance (every loss-side detector returns it from ``probes()``;
        the collector sets a probe up once)."""
        inst = extras.get("loss_inputs")
        if inst is None:
            inst = extras["loss_inputs"] = cls()
        assert isinstance(inst, LossInputs)
        return inst

    def setup(self, host: ProbeHost) -> None:
        self.host = host
        lo, hi = host.ledger.add_minmax_block("loss_input", ["values", "rowsum_dev"])
        self._slots = (lo.start, hi.start, hi.start + 1)
        F = torch.nn.functional
        for name in BROADCAST_LOSSES + LOGIT_LOSSES:
            if hasattr(F, name):
                host.hooks.subscribe(patch_for(F, name), _Listener(self, name))
        self._names = {id(m): name for name, m in host.map.modules}

    def output_modules(self, host: ProbeHost) -> Iterable[nn.Module]:
        # the root too: a loss input that is the model's own output, made by a functional call
        # (F.softmax, torch.sigmoid) as the last op of its forward, is named by that call site
        return [m for _, m in host.map.modules if isinstance(m, _PROB_MODULES) or m is host.map.root]

    def due(self, step: int) -> bool:
        """The producers are needed on the steps whose loss inputs are probed."""
        return sampled(step, self.probe_first, self.probe_every)

    def on_output(self, slot: int, module: nn.Module, args: Any, t: torch.Tensor, compiling: bool) -> None:
        if compiling or t in self._prob_outputs:
            return  # an inner probability module produced this same tensor: it is the producer
        if isinstance(module, _PROB_MODULES):
            self._prob_outputs[t] = (self._names.get(id(module), ""), False)
        else:
            self._prob_outputs[t] = (self._names.get(id(module), ""), True)

    def on_backward(self, loss: torch.Tensor) -> None:
        if not self.compiled_loss:
            # Made by a compiled graph (aot_autograd's node): the loss was computed inside it.
            self.compiled_loss = type(loss.grad_fn).__name__.startswith("CompiledFunction")

    def blind_under_compile(self) -> bool:
        """Whether the loss is computed inside compiled code (HF's ``labels=``, nanoGPT's
        ``forward(idx, targets)`` under torch.compile), where the watched loss functions are
        traced, not seen, and none was called outside it so far."""
        return self.compiled_loss and self.eager_calls == 0

    def close(self) -> None:
        self.host = None

    def on_loss(self, function: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        c = self.host
        if c is None or _is_compiling() or not torch.is_grad_enabled():
            return
        self.eager_calls += 1
        x = args[0] if args else kwargs.get("input")
        y = args[1] if len(args) > 1 else kwargs.get("target")
        if not isinstance(x, torch.Tensor) or not x.requires_grad:
            return
        if function in BROADCAST_LOSSES and isinstance(y, torch.Tensor) and x.shape != y.shape:
            self._check_broadcast(c.step, function, tuple(x.shape), tuple(y.shape))
        if function in LOGIT_LOSSES and x.is_floating_point() and x.numel():
            if function != "binary_cross_entropy_with_logits" and x.ndim >= 2:
                self.classes = int(x.shape[1])
            if self.due(c.step):
                self._probe(c, function, x)

    def _check_broadcast(self, step: int, function: str, xs: tuple[int, ...], ys: tuple[int, ...]) -> None:
        try:
            out = tuple(torch.broadcast_shapes(xs, ys))
        except RuntimeError:
            return  # the loss itself raises on this mismatch
        target_numel = 1
        for d in ys:
            target_numel *= d
        if out == xs and (target_numel == 1 or out == ys):
            return  # a scalar target (a constant to regress to) broadcasts as intended
        if len(self.broadcasts) < 16:
            self.broadcasts.append(BroadcastEvent(step, function, xs, ys, out))

    def _probe(self, c: Any, function: str, x: torch.Tensor) -> None:
        views = c.ledger.views
        lo, hi, dev_hi = self._slots
        with torch.no_grad():
            d = x.detach()
            mn, mx = torch.aminmax(d)
            torch.minimum(views[lo], mn, out=views[lo])  # in the row's dtype (float64 if need be)
            torch.maximum(views[hi], mx, out=views[hi])
            if function != "binary_cross_entropy_with_logits":
                dim = 1 if d.ndim >= 2 else 0
                dev = (d.float().sum(dim=dim) - 1.0).abs().amax()
                torch.maximum(views[dev_hi], dev, out=views[dev_hi])
        meta = c.meta
        meta.extra["loss_probe"] = function
        producer = self._prob_outputs.get(x)
        if producer is not None:
            meta.extra["loss_input_module"] = producer[0]
        if x.grad_fn is not None and (producer is None or producer[1]):
            meta.extra["loss_input_op"] = type(x.grad_fn).__name__
            if producer is not None:  # a functional call in that module's forward
                meta.extra["loss_input_site"] = forward_site(c.map.root)
