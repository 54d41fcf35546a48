"""One owner for every RemovableHandle and patch subscription, so detach() undoes all of them."""

from __future__ import annotations

import functools
import operator
import sys
import weakref
from typing import Any, Callable

from torch.utils.hooks import RemovableHandle

from .._errors import SentinelError, without_our_frames
from .patches import Patch, PatchListener

__all__ = ["HookSet", "ModuleHook", "WeakHook"]


#: What an entry the copy could not leave out becomes: a builtin that takes any arguments and
#: returns None. It holds no reference and names nothing of torch_sentinel, so a file holding
#: it loads where torch_sentinel is not installed (an audit hook, if any, sees the event).
_INERT_EVENT = "torch_sentinel.copied_hook"


class ModuleHook(functools.partial):
    """A hook stored in a module's hook dicts: ``ModuleHook(fn, *args)`` calls ``fn(*args, ...)``.

    Copies and pickles of the module leave these entries out (``copies.py``). Where a module's
    class reduces itself in a way that cannot be edited, the entry copies and pickles as
    ``functools.partial(sys.audit, ...)``: a no-op returning None, with no reference to the
    sentinel or to any tensor. It is a ``functools.partial``, so calling it adds no Python frame.
    """

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return functools.partial(sys.audit, _INERT_EVENT)

    def __reduce__(self) -> Any:
        return (functools.partial, (sys.audit, _INERT_EVENT))


class HookSet:
    def __init__(self) -> None:
        self._handles: list[RemovableHandle] = []
        self._patches: list[tuple[Patch, PatchListener]] = []
        self._listeners: list[PatchListener] = []
        #: Each patch once (several listeners may subscribe to one).
        self._distinct: list[Patch] = []
        #: Where each distinct patch's wrapper was at the last check, and the wrapper found
        #: there: :meth:`ensure_patches` compares the two lists in one C-level pass.
        self._namespaces: list[Any] = []
        self._attrs: list[str] = []
        self._wrappers: list[Any] = []

    def add(self, handle: RemovableHandle) -> RemovableHandle:
        self._handles.append(handle)
        return handle

    def subscribe(self, patch: Patch, listener: PatchListener) -> None:
        # Patches are process-wide: through a strong reference, a listener (and the probe or
        # collector behind it) would outlive a model and sentinel dropped without detach().
        # The patch gets a weak proxy; this HookSet, owned by the collector, keeps the listener.
        proxy = _WeakListener(listener)
        patch.add(proxy)
        self._patches.append((patch, proxy))
        self._listeners.append(listener)
        if patch not in self._distinct:
            self._distinct.append(patch)
        self._snapshot()

    def _snapshot(self) -> None:
        self._namespaces = [p.namespace for p in self._distinct]
        self._attrs = [p.attr for p in self._distinct]
        self._wrappers = [p.wrapper for p in self._distinct]

    def ensure_patches(self) -> int:
        """Re-install any of our patches that another library removed; how many it had to.
        Called before every root forward and optimizer step. The usual case, every wrapper
        where it was, is one C-level pass (``map`` of item lookups, no Python frame per
        patch); otherwise each patch checks itself (:meth:`Patch.ensure`)."""
        try:
            if all(map(operator.is_, map(operator.getitem, self._namespaces, self._attrs), self._wrappers)):
                return 0
        except KeyError:  # a wrapper on a class, taken off it: the slow path puts it back
            pass
        fixed = sum(patch.ensure() for patch in self._distinct)
        self._snapshot()
        return fixed

    def __len__(self) -> int:
        return len(self._handles) + len(self._patches)

    def close(self) -> None:
        """Remove everything, newest first; one failure does not stop the rest."""
        errors: list[BaseException] = []
        while self._handles:
            handle = self._handles.pop()
            try:
                handle.remove()
            except Exception as exc:  # pragma: no cover - defensive
                errors.append(exc)
        while self._patches:
            patch, listener = self._patches.pop()
            try:
                patch.remove(listener)
            except Exception as exc:  # pragma: no cover - defensive
                errors.append(exc)
        self._listeners.clear()
        self._distinct.clear()
        self._snapshot()
        if errors:
            raise errors[0]




class _WeakListener:
    """Forwards a patch's calls to a listener held weakly; once it is gone, does nothing."""

    __slots__ = ("_ref",)

    def __init__(self, listener: PatchListener) -> None:
        self._ref = weakref.ref(listener)

    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        listener = self._ref()
        if listener is not None:
            listener.before(args, kwargs)

    def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        listener = self._ref()
        if listener is not None:
            listener.after(args, kwargs, result)


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
