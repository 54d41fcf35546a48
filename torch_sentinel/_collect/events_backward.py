"""The backward of a training step: ``loss.backward()``, ``zero_grad()`` and ``GradScaler.scale``.

There is no public hook for "``backward()`` was called on this tensor", for ``zero_grad()`` or
for ``GradScaler.scale``: they are seen through process-wide patches (``patches.py``), whose
listeners below hold the backward events weakly, so a patch never keeps a detached sentinel
alive. Which backward belongs to this model is ``scope.py``'s call.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from .driver import Driver
from .events_forward import in_transform

__all__ = ["BackwardEvents", "BackwardListener", "ScaleListener", "ZeroGradListener"]


class BackwardEvents:
    """Receives the backward patch's calls and the autograd hooks that say a backward reached
    the model, and turns them into the probes' ``on_backward``."""

    def __init__(self, driver: Driver) -> None:
        self._d = driver

    def on_scale(self, scaler: Any, outputs: Any, result: Any) -> None:
        if not self._d.disabled:
            self._d.amp.on_scale(scaler, outputs, result)

    def before_backward(self, tensors: Any) -> None:
        d = self._d
        if d.disabled or in_transform(d):
            return
        if isinstance(tensors, (list, tuple)):
            if len(tensors) != 1:
                return
            tensors = tensors[0]
        if not isinstance(tensors, torch.Tensor) or tensors.numel() != 1 or not tensors.requires_grad:
            return
        d.flush_pending()  # modules called from the loop (no root forward) end here
        loss = d.amp.unscaled(tensors)
        scope = d.scope
        if scope.unmarked or not scope.supported:
            # Outputs not marked: fall back to "a backward after a forward of the model".
            if scope.forward_since_backward:
                scope.forward_since_backward = scope.unmarked = False
                self.reached(loss)
            return
        after_forward, scope.forward_since_backward = scope.forward_since_backward, False
        if after_forward and d.immediate:
            # Checked before backward starts, as the first thing a bad loss reaches (the
            # output gradients it makes come next); which model it belongs to comes later.
            d.loss.check_now(loss)
        if not scope.begin(tensors, loss, orphan=after_forward) and after_forward:
            self.reached(loss)

    def reached(self, loss: torch.Tensor) -> None:
        """A backward on ``loss`` passed through the model (on an autograd thread, maybe).

        It counts toward this model's next step unless its gradients are cleared first: a
        backward that reached the model while earlier ones were pending, and finds every
        gradient cleared, drops those (a GAN's generator loss reaches the discriminator, whose
        ``zero_grad()`` then throws those gradients away).
        """
        d = self._d
        if d.disabled or d.closures.tail:
            return
        if d.loss.pending_calls and d.cleared.everything():
            d.loss.discard()
            d.emit("on_cleared")
        d.cleared.reset()
        d.meta.backward_calls += 1
        d.backward_steps.count()
        d.loss.add(loss)
        d.emit("on_backward", loss)

    def on_zero_grad(self, owner: Any) -> None:
        """``owner.zero_grad()`` returned (any ``set_to_none``): see cleared.py."""
        d = self._d
        if not d.disabled and d.loss.pending_calls:
            d.cleared.note(owner)

    def after_backward(self) -> None:
        """A backward on the model finished.

        A backward that followed a forward of this model but reached no attached model at all
        cut the graph between the model and the loss: it is charged here, as the evidence the
        graph-cut detectors read. Without an optimizer, the backward was a step
        (``stepping.BackwardSteps``); with optimizers, their step hooks close the row.
        """
        d = self._d
        if not d.disabled:
            d.flush_pending()  # the end of backward: a boundary
        orphan = d.scope.end()
        if orphan is not None:
            self.reached(orphan)
        d.backward_steps.finish()


class BackwardListener:
    """Sees ``torch.autograd.backward`` (hence ``loss.backward()``) while attached."""

    def __init__(self, events: BackwardEvents) -> None:
        self._events = weakref.ref(events)

    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        events = self._events()
        if events is not None:
            events.before_backward(args[0] if args else kwargs.get("tensors"))

    def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        events = self._events()
        if events is not None:
            events.after_backward()


class ZeroGradListener:
    """Sees ``Module.zero_grad`` and ``Optimizer.zero_grad``, whatever ``set_to_none`` says:
    gradients zeroed in place are cleared as surely as gradients set to None."""

    def __init__(self, events: BackwardEvents) -> None:
        self._events = weakref.ref(events)

    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        return None

    def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        events = self._events()
        if events is not None and args:
            events.on_zero_grad(args[0])


class ScaleListener:
    """Sees ``GradScaler.scale(loss)`` so the recorded loss is the unscaled one."""

    def __init__(self, events: BackwardEvents) -> None:
        self._events = weakref.ref(events)

    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        return None

    def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        events = self._events()
        if events is not None and len(args) >= 2:
            events.on_scale(args[0], args[1], result)
