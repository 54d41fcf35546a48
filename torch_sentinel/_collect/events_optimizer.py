"""The optimizer step of a training step: its pre- and post-step hooks, ``step(closure)``, and
``GradScaler.step``, which may skip the optimizer's step altogether.

The optimizer's own ``register_step_pre_hook`` / ``register_step_post_hook`` carry the step;
``GradScaler.step`` has no hook, so it is seen through a patch (a step the scaler skips never
reaches the optimizer, and the row must close all the same).
"""

from __future__ import annotations

import weakref
from typing import Any, Optional

import torch

from .driver import Driver
from .patches import RAISED

__all__ = ["OptimizerEvents", "ScalerStepListener"]


class OptimizerEvents:
    """Turns an optimizer's step into the probes' ``on_pre_step`` / ``on_post_step`` and closes
    the step's row once every optimizer of the model stepped."""

    def __init__(self, driver: Driver) -> None:
        self._d = driver

    def before_scaler_step(self, scaler: Any, optimizer: Any) -> None:
        if optimizer in self._d.optimizers:
            self._d.amp.before_scaler_step()

    def after_scaler_step(self, scaler: Any, optimizer: Any, raised: bool = False) -> None:
        d = self._d
        if optimizer in d.optimizers and d.amp.after_scaler_step(scaler, raised):
            d.close_row()  # the scaler found inf/NaN and skipped optimizer.step()

    def on_pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> Optional[tuple[Any, Any]]:
        d = self._d
        if d.disabled:
            return None
        d.drain_landed()
        d.hooks.ensure_patches()  # another library may have put back what it saved
        wrapped = d.closures.wrap(optimizer, args, kwargs)
        if wrapped is not None:
            return wrapped
        self.before_update(optimizer)
        return None

    def before_update(self, optimizer: Any) -> None:
        """The gradients are final (after a closure's first evaluation, if any)."""
        d = self._d
        d.flush_pending()  # gradients are final: nothing pending may reach the update
        d.loss.commit()
        with torch.no_grad():
            d.emit("on_pre_step", optimizer)

    def on_post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        d = self._d
        if d.disabled:
            return
        d.closures.end()
        d.amp.optimizer_stepped()
        d.emit("on_post_step", optimizer)
        stepped = d.open.stepped
        if id(optimizer) in stepped:
            # This optimizer stepped twice in one row (e.g. several critic steps per generator
            # step): the previous row is complete.
            d.close_row()
            stepped = d.open.stepped
        stepped.add(id(optimizer))
        if len(stepped) >= len(d.optimizers):
            d.close_row()


class ScalerStepListener:
    """Sees ``GradScaler.step(optimizer)``: a step the scaler skips never reaches the optimizer."""

    def __init__(self, events: OptimizerEvents) -> None:
        self._events = weakref.ref(events)

    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        events = self._events()
        if events is not None and len(args) >= 2:
            events.before_scaler_step(args[0], args[1])

    def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        events = self._events()
        if events is not None and len(args) >= 2:
            events.after_scaler_step(args[0], args[1], raised=result is RAISED)
