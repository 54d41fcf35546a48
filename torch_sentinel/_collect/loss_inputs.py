"""What the loss function was given: shapes (host facts) and a probability probe (device).

``torch.nn.functional`` losses are observed through the shared function patches; the
``nn.*Loss`` modules call them, so both spellings are seen. Only training calls count (grad
enabled, input requiring grad): a validation loss under ``no_grad`` is not a training fault.

Per sampled step the probe reduces, on the device, the input's min and max and the largest
deviation of a row sum (over the class dim) from 1 into ledger slots: a tensor of non-negative
rows that sum to 1 is a probability distribution, not logits.

Facts: :class:`LossCall` (which loss ran on the step, what produced its input),
:class:`LossInputRange` (the device reductions, on probed steps), :class:`LossBroadcasts`
(element-wise losses whose target broadcast) and :class:`CompiledLoss` (the loss reaching
backward came out of a compiled graph).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterable
from typing import Any, ClassVar, Optional

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from .._record import Fact, StepRecord
from .cadence import sampled
from .compat import is_compiling as _is_compiling
from .patches import patch_for
from .probe import Probe, ProbeHost

__all__ = ["BROADCAST_LOSSES", "LOGIT_LOSSES", "BroadcastEvent", "CompiledLoss", "LossBroadcasts",
           "LossCall", "LossInputRange", "LossInputs", "forward_site"]


#: Element-wise losses that broadcast a mismatched target instead of refusing it.
BROADCAST_LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
#: Losses that expect logits (or log-probabilities, for nll_loss) along dim 1.
LOGIT_LOSSES = ("cross_entropy", "nll_loss", "binary_cross_entropy_with_logits")

_PROB_MODULES = (nn.Softmax, nn.Sigmoid, nn.Softmax2d)


@dataclasses.dataclass(frozen=True)
class BroadcastEvent:
    """One element-wise loss call whose input and target shapes broadcast to a third shape."""

    step: int
    function: str
    input_shape: tuple[int, ...]
    target_shape: tuple[int, ...]
    broadcast_shape: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class LossCall(Fact):
    """A watched loss function ran in a training call on this step (host facts)."""

    #: ``cross_entropy``, ``nll_loss``, ``mse_loss``, ...
    function: str
    #: The size of the class dimension (dim 1) for cross_entropy / nll_loss, else None.
    classes: Optional[int] = None
    #: The module whose output was the loss input (``""``: the model itself), when known.
    input_module: Optional[str] = None
    #: The autograd node that made the loss input (``SoftmaxBackward0``), when known.
    input_op: Optional[str] = None
    #: Where a functional call made it: ``Class.forward (file.py:line)``.
    site: Optional[str] = None
    #: The input was probed on the device this step (see :class:`LossInputRange`).
    probed: bool = False


@dataclasses.dataclass(frozen=True)
class LossInputRange(Fact):
    """Device reductions of the loss input on a probed step: its min and max, and the largest
    deviation of a row sum over the class dim from 1 (a probability distribution's is 0)."""

    min: float
    max: float
    rowsum_deviation: float


@dataclasses.dataclass(frozen=True)
class LossBroadcasts(Fact):
    """Element-wise loss calls of the step whose target broadcast against the input."""

    events: tuple[BroadcastEvent, ...]


@dataclasses.dataclass(frozen=True)
class CompiledLoss(Fact):
    """The loss reaching backward was a compiled graph's output, and no watched loss function
    had been seen outside compiled code so far: the loss is computed inside compiled code."""


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
    """What the watched loss functions were given in training calls (one per sentinel, set up
    for every reader of its facts)."""

    name = "loss_inputs"
    publishes = (LossCall, LossInputRange, LossBroadcasts, CompiledLoss)
    live_attributes: ClassVar[frozenset[str]] = frozenset(
        {"probe_first", "probe_every", "_prob_outputs", "_slots", "_names"})

    def __init__(self, probe_first: int = 5, probe_every: int = 10) -> None:
        self.probe_first = probe_first
        self.probe_every = probe_every
        self.host: Optional[ProbeHost] = None
        self._prob_outputs: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._slots: tuple[int, int, int] = (0, 0, 0)
        #: Training calls of the watched loss functions seen outside compiled code.
        self._eager_calls = 0

    def setup(self, host: ProbeHost) -> None:
        self.host = host
        lo, hi = host.ledger.add_minmax_block("loss_input", ["values", "rowsum_dev"])
        self._slots = (lo.start, hi.start, hi.start + 1)
        F = torch.nn.functional
        for name in BROADCAST_LOSSES + LOGIT_LOSSES:
            if hasattr(F, name):
                host.hooks.subscribe(patch_for(F, name), _Listener(self, name))
        self._names = {id(m): name for name, m in host.map.modules}
        host.provide(LossInputRange, _input_range)

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
        # Made by a compiled graph (aot_autograd's node), with no watched loss function seen
        # outside it: the loss was computed inside compiled code (HF's ``labels=``, nanoGPT's
        # ``forward(idx, targets)`` under torch.compile), where those calls are traced, not seen.
        if self.host is not None and self._eager_calls == 0 \
                and type(loss.grad_fn).__name__.startswith("CompiledFunction"):
            self.host.publish(CompiledLoss())

    def close(self) -> None:
        self.host = None

    def on_loss(self, function: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        c = self.host
        if c is None or _is_compiling() or not torch.is_grad_enabled():
            return
        self._eager_calls += 1
        x = args[0] if args else kwargs.get("input")
        y = args[1] if len(args) > 1 else kwargs.get("target")
        if not isinstance(x, torch.Tensor) or not x.requires_grad:
            return
        if function in BROADCAST_LOSSES and isinstance(y, torch.Tensor) and x.shape != y.shape:
            self._check_broadcast(c.step, function, tuple(x.shape), tuple(y.shape))
        if function in LOGIT_LOSSES and x.is_floating_point() and x.numel():
            classes = int(x.shape[1]) if function != "binary_cross_entropy_with_logits" and x.ndim >= 2 else None
            c.publish(self._probe(c, function, x, classes) if self.due(c.step)
                      else LossCall(function, classes))

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
        host = self.host
        seen = host.meta.facts.get(LossBroadcasts) if host is not None else None
        events = seen.events if isinstance(seen, LossBroadcasts) else ()
        if host is not None and len(events) < 16:
            host.publish(LossBroadcasts((*events, BroadcastEvent(step, function, xs, ys, out))))

    def _probe(self, c: Any, function: str, x: torch.Tensor, classes: Optional[int]) -> LossCall:
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
        producer = self._prob_outputs.get(x)
        module = producer[0] if producer is not None else None
        op = site = None
        if x.grad_fn is not None and (producer is None or producer[1]):
            op = type(x.grad_fn).__name__
            if producer is not None:  # a functional call in that module's forward
                site = forward_site(c.map.root)
        return LossCall(function, classes, module, op, site, probed=True)


def _input_range(record: StepRecord) -> Optional[LossInputRange]:
    call = record.fact(LossCall)
    if call is None or not call.probed:
        return None
    return LossInputRange(record.value("loss_input.min", "values"), record.value("loss_input.max", "values"),
                          record.value("loss_input.max", "rowsum_dev"))
