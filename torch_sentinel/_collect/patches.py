"""Process-wide function patches, shared by every attached sentinel and undone exactly.

Some evidence can only be seen by observing a function rather than a module: ``loss.backward()``
(it calls ``torch.autograd.backward``), ``GradScaler.scale``/``step``, and functional ReLUs. A
:class:`Patch` installs one wrapper the first time a listener subscribes and puts the original
back when the last one leaves. If someone else wrapped the function after us, removing our
wrapper would remove theirs too, so ours stays in place as a pass-through instead.

The world moves under a patch: another library may wrap the function after us, or restore a
copy it saved before we came (our wrapper is then gone without ``detach()``). :meth:`Patch.ensure`
(called before every optimizer step) checks that the installed function still leads to our
wrapper and wraps again if not. A wrapper never fires its listeners twice for one call (a
thread-local depth), so a stale copy of it further down a chain only passes through.

The user's call always runs: a listener that raises (a sentinel bug) is logged once and
removed; ``after`` listeners run in ``finally``, with ``result`` set to :data:`RAISED` when the
original raised, and the user's exception propagates unchanged.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any, Callable, Protocol

from .._errors import SentinelError, without_our_frames

__all__ = ["RAISED", "Patch", "PatchListener", "patch_for"]

logger = logging.getLogger("torch_sentinel")

#: The ``result`` an ``after`` listener receives when the original function raised.
RAISED: Any = type("Raised", (), {"__repr__": lambda self: "<raised>"})()


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
        self._depth = threading.local()
        #: The owner's namespace (a live view), where an installed wrapper sits.
        self._namespace: Any = getattr(owner, "__dict__", {})

    @property
    def namespace(self) -> Any:
        """The owner's namespace (a live view), where an installed wrapper sits."""
        return self._namespace

    # -- the wrapper ------------------------------------------------------------------------
    def _make_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        listeners = self.listeners
        depth = self._depth
        patch = self

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not listeners or getattr(depth, "n", False):
                return original(*args, **kwargs)  # nobody listens, or an outer copy already did
            active = tuple(listeners)
            depth.n = True
            try:
                for listener in active:
                    try:
                        listener.before(args, kwargs)
                    except SentinelError as err:
                        raise without_our_frames(err)  # noqa: B904 - an immediate fault the user asked to raise
                    except Exception as exc:
                        patch._drop(listener, exc)
                result = RAISED
                try:
                    result = original(*args, **kwargs)
                finally:
                    for listener in active:
                        try:
                            listener.after(args, kwargs, result)
                        except SentinelError as err:
                            if result is not RAISED:
                                raise without_our_frames(err)  # noqa: B904 - else the user's own exception is on its way
                        except Exception as exc:
                            patch._drop(listener, exc)
                return result
            finally:
                depth.n = False

        wrapper.__torch_sentinel_patch__ = True  # type: ignore[attr-defined]
        return wrapper

    def _drop(self, listener: PatchListener, exc: BaseException) -> None:
        logger.warning("torch_sentinel: a listener on %s.%s failed and is switched off (%s: %s); "
                       "the call itself ran", getattr(self.owner, "__name__", self.owner), self.attr,
                       type(exc).__name__, exc)
        with self._lock:
            if listener in self.listeners:
                self.listeners.remove(listener)

    # -- installing -------------------------------------------------------------------------
    def _current(self) -> Any:
        if isinstance(self.owner, type):
            return self.owner.__dict__.get(self.attr, _INHERITED)
        return getattr(self.owner, self.attr, None)

    def _install(self) -> None:
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

    def leads_to_wrapper(self) -> bool:
        """Whether calling the installed function reaches our wrapper (directly, or through
        wrappers added on top that name what they wrap in ``__wrapped__``)."""
        fn = self._current()
        for _ in range(32):
            if fn is self.wrapper:
                return True
            fn = getattr(fn, "__wrapped__", None)
            if fn is None:
                return False
        return False

    def ensure(self) -> bool:
        """Wrap again if our wrapper was removed by someone else (e.g. a library restoring a
        saved original). Returns True when it had to. Host only: an attribute read per call."""
        wrapper = self.wrapper
        if wrapper is None or self._namespace.get(self.attr) is wrapper:  # the usual case: one dict read
            return False
        if self._current() is wrapper:
            return False
        with self._lock:
            if self.wrapper is None or self.leads_to_wrapper() or not self.listeners:
                return False
            # Our old wrapper stays wherever someone kept it: it passes through (depth guard).
            self._install()
            return True

    def add(self, listener: PatchListener) -> None:
        with self._lock:
            if self.wrapper is None:
                self._install()
            self.listeners.append(listener)

    def remove(self, listener: PatchListener) -> None:
        with self._lock:
            if listener in self.listeners:
                self.listeners.remove(listener)
            if self.listeners or self.wrapper is None:
                return
            if self._current() is self.wrapper:
                if self.original is _INHERITED:
                    delattr(self.owner, self.attr)
                else:
                    setattr(self.owner, self.attr, self.original)
            # else: someone patched on top of us (or put something else there); our wrapper,
            # if still in a chain, passes through since it has no listeners.
            self.wrapper = None
            self.original = None


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
