"""One owner for every RemovableHandle and patch subscription, so detach() undoes all of them."""

from __future__ import annotations

import functools
import weakref
from typing import Any

from torch.utils.hooks import RemovableHandle

from .patches import Patch, PatchListener

__all__ = ["HookSet", "ModuleHook"]


def _inert(*args: Any, **kwargs: Any) -> None:
    """What a copied or unpickled module gets in place of a sentinel hook: nothing."""
    return None


def _make_inert() -> Any:
    return _inert


class ModuleHook(functools.partial):
    """A hook stored in a module's hook dicts: ``ModuleHook(fn, *args)`` calls ``fn(*args, ...)``.

    A module keeps its hooks in plain dicts, so ``copy.deepcopy(model)`` (EMA copies,
    ``swa_utils.AveragedModel``, best-model snapshots) and ``torch.save(model)`` would copy or
    pickle the whole sentinel behind them (locks, writers, the ledger) and fail, or instrument
    the copy. A ModuleHook deep-copies and pickles as an inert function: the copy works and is
    not watched. It is a ``functools.partial``, so calling it adds no Python frame.
    """

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return _inert

    def __reduce__(self) -> Any:
        return (_make_inert, ())


class HookSet:
    def __init__(self) -> None:
        self._handles: list[RemovableHandle] = []
        self._patches: list[tuple[Patch, PatchListener]] = []
        self._listeners: list[PatchListener] = []
        #: Each subscribed patch once, for :meth:`ensure_patches`.
        self._unique: list[Patch] = []

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
        if all(p is not patch for p in self._unique):
            self._unique.append(patch)

    def ensure_patches(self) -> int:
        """Re-install any of our patches that another library removed; how many it had to."""
        fixed = 0
        for patch in self._unique:  # before every optimizer step: one dict lookup per patch
            if not patch.installed():
                fixed += patch.ensure()
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
        self._unique.clear()
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
