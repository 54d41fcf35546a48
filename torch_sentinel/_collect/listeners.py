"""The collector's patch listeners: ``loss.backward()``, ``zero_grad()`` and the AMP ``GradScaler``.

Each forwards to a public method of the collector and holds it weakly: patches are
process-wide, and a listener must never keep a detached sentinel alive.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable

from .._errors import SentinelError, without_our_frames
from .patches import RAISED

if TYPE_CHECKING:
    from .collector import Collector

__all__ = ["BackwardListener", "ScaleListener", "ScalerStepListener", "WeakHook", "ZeroGradListener"]


class BackwardListener:
    """Sees ``torch.autograd.backward`` (hence ``loss.backward()``) while attached."""

    def __init__(self, collector: Collector) -> None:
        self._collector = weakref.ref(collector)

    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        c = self._collector()
        if c is not None:
            c.before_backward(args[0] if args else kwargs.get("tensors"))

    def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        c = self._collector()
        if c is not None:
            c.after_backward()


class ZeroGradListener:
    """Sees ``Module.zero_grad`` and ``Optimizer.zero_grad``, whatever ``set_to_none`` says:
    gradients zeroed in place are cleared as surely as gradients set to None."""

    def __init__(self, collector: Collector) -> None:
        self._collector = weakref.ref(collector)

    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        return None

    def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        c = self._collector()
        if c is not None and args:
            c.on_zero_grad(args[0])


class ScaleListener:
    """Sees ``GradScaler.scale(loss)`` so the recorded loss is the unscaled one."""

    def __init__(self, collector: Collector) -> None:
        self._collector = weakref.ref(collector)

    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        return None

    def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        c = self._collector()
        if c is not None and len(args) >= 2:
            c.on_scale(args[0], args[1], result)


class ScalerStepListener:
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
            c.after_scaler_step(args[0], args[1], raised=result is RAISED)


class WeakHook:
    """A hook that calls a collector's bound method through a weak reference.

    For hooks on objects the user may keep after the model is gone (the optimizer): through
    a strong reference, a kept optimizer would keep the collector, and with it the model.
    Once the collector is gone the hook does nothing (it is removed at close anyway).
    """

    __slots__ = ("_method",)

    def __init__(self, method: Callable[..., Any]) -> None:
        self._method = weakref.WeakMethod(method)

    def __call__(self, *args: Any) -> Any:
        method = self._method()
        if method is None:
            return None
        try:
            return method(*args)
        except SentinelError as err:  # an optimizer step: where the user's call entered
            raise without_our_frames(err)  # noqa: B904 - the same error, its traceback shortened
