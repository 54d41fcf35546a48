"""Process-wide function patches, shared by every attached sentinel and undone exactly.

Some evidence can only be seen by observing a function rather than a module: ``loss.backward()``
(it calls ``torch.autograd.backward``), ``GradScaler.scale``/``step``, and functional ReLUs. A
:class:`Patch` installs one wrapper the first time a listener subscribes and puts the original
back when the last one leaves. If someone else wrapped the function after us, removing our
wrapper would remove theirs too, so ours stays in place as a pass-through instead.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Protocol

__all__ = ["Patch", "PatchListener", "patch_for"]


class PatchListener(Protocol):
    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None: ...

    def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None: ...


class Patch:
    def __init__(self, owner: Any, attr: str) -> None:
        self.owner = owner
        self.attr = attr
        self.original: Any = None
        self.wrapper: Any = None
        self.listeners: list[PatchListener] = []
        self._lock = threading.Lock()

    def _make_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        listeners = self.listeners

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not listeners:
                return original(*args, **kwargs)
            active = tuple(listeners)
            for listener in active:
                listener.before(args, kwargs)
            result = original(*args, **kwargs)
            for listener in active:
                listener.after(args, kwargs, result)
            return result

        wrapper.__torch_sentinel_patch__ = True  # type: ignore[attr-defined]
        return wrapper

    def add(self, listener: PatchListener) -> None:
        with self._lock:
            if self.wrapper is None:
                if isinstance(self.owner, type):
                    # A method inherited from a C base (e.g. Tensor.relu from TensorBase) is not in
                    # the class __dict__: shadow it on the class and delete the shadow on removal.
                    self.original = self.owner.__dict__.get(self.attr, _INHERITED)
                    target = getattr(self.owner, self.attr) if self.original is _INHERITED else self.original
                else:
                    self.original = target = getattr(self.owner, self.attr)
                self.wrapper = self._make_wrapper(
                    target.__func__ if isinstance(target, (staticmethod, classmethod)) else target
                )
                setattr(self.owner, self.attr, self.wrapper)
            self.listeners.append(listener)

    def remove(self, listener: PatchListener) -> None:
        with self._lock:
            if listener in self.listeners:
                self.listeners.remove(listener)
            if self.listeners or self.wrapper is None:
                return
            current = self.owner.__dict__.get(self.attr) if isinstance(self.owner, type) else getattr(self.owner, self.attr, None)
            if current is self.wrapper:
                if self.original is _INHERITED:
                    delattr(self.owner, self.attr)
                else:
                    setattr(self.owner, self.attr, self.original)
                self.wrapper = None
                self.original = None
            # else: someone patched on top of us; our wrapper stays as a pass-through.


_INHERITED = object()
_PATCHES: dict[tuple[int, str], Patch] = {}
_PATCHES_LOCK = threading.Lock()


def patch_for(owner: Any, attr: str) -> Patch:
    """The shared :class:`Patch` of ``owner.attr``."""
    key = (id(owner), attr)
    with _PATCHES_LOCK:
        patch = _PATCHES.get(key)
        if patch is None:
            patch = _PATCHES[key] = Patch(owner, attr)
        return patch
