"""What differs across the torch versions we support (torch >= 2.4)."""

from __future__ import annotations

import types
from collections import OrderedDict
from typing import Any, Callable, Optional

import torch
from torch.utils.hooks import RemovableHandle

__all__ = [
    "CALL_IMPL_CODE",
    "compiled_entries",
    "compiled_in_place",
    "drop_compiled",
    "drop_hooks_from_state",
    "forward_hooks",
    "hook_handles_made",
    "inline_wrapper_code",
    "is_compiling",
    "sparse_values",
]

#: True while torch.compile traces a hook: host-side bookkeeping must be skipped then.
is_compiling: Callable[[], bool] = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


def forward_hooks(module: torch.nn.Module) -> Optional[dict[int, Any]]:
    """The module's forward hooks by handle id, in the order torch runs them; None where this
    torch keeps them elsewhere. There is no public way to keep a hook last (``prepend`` only
    places a hook when it is registered), so the order is read from torch's own dict."""
    hooks = getattr(module, "_forward_hooks", None)
    return hooks if isinstance(hooks, dict) else None  # an OrderedDict; dict's check is the cheap one


def hook_handles_made() -> Optional[int]:
    """How many hook handles torch has handed out in this process (module, tensor and optimizer
    hooks share one counter); None where this torch keeps no such counter. While it stands still,
    no hook was registered anywhere."""
    count = getattr(RemovableHandle, "next_id", None)
    return count if isinstance(count, int) else None


#: torch's per-hook flags, keyed by handle id like the hook dicts themselves.
_HOOK_FLAGS = ("_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs")


def drop_hooks_from_state(state: dict[str, Any], ours: Callable[[Any], bool]) -> None:
    """Take the hooks that ``ours`` recognises out of ``state``, a module's pickled state (the
    fresh copy of its ``__dict__`` that ``__getstate__`` returns): each hook dict holding one is
    replaced by a copy without it, and torch's flags for those handle ids go too. The module
    itself is not touched."""
    dropped: set[Any] = set()
    for name, hooks in list(state.items()):
        if "hooks" not in name or type(hooks) not in (dict, OrderedDict):
            continue
        gone = [key for key, hook in hooks.items() if ours(hook)]
        if gone:
            dropped.update(gone)
            state[name] = type(hooks)((key, hook) for key, hook in hooks.items() if key not in dropped)
    for name in _HOOK_FLAGS:
        flags: Any = state.get(name)
        if dropped and type(flags) in (dict, OrderedDict) and not dropped.isdisjoint(flags):
            state[name] = type(flags)((key, flag) for key, flag in flags.items() if key not in dropped)


#: The code every module call runs through (``nn.Module._call_impl``): a frame of it is a
#: module call on the stack, and ``model.compile()`` compiles it.
CALL_IMPL_CODE: types.CodeType = torch.nn.Module._call_impl.__code__


def compiled_in_place(module: torch.nn.Module) -> bool:
    """Whether ``module.compile()`` was called (torch keeps that compiled call on the module)."""
    return getattr(module, "_compiled_call_impl", None) is not None


def inline_wrapper_code(module: torch.nn.Module) -> Optional[types.CodeType]:
    """The code of the wrapper dynamo compiles for a root that is a ``torch.nn`` class."""
    try:
        from torch._dynamo.external_utils import wrap_inline

        return wrap_inline(module).__code__
    except Exception:  # pragma: no cover - older dynamo
        return None


def compiled_entries(code: types.CodeType) -> int:
    """How many compiled versions dynamo keeps for ``code`` (0 without dynamo)."""
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    except Exception:  # pragma: no cover - torch without dynamo
        return 0
    return len(_debug_get_cache_entry_list(code))


def drop_compiled(code: types.CodeType) -> bool:
    """Drop dynamo's compiled versions of ``code`` alone (its next call recompiles); False
    without dynamo."""
    try:
        from torch._dynamo.eval_frame import remove_from_cache
    except Exception:  # pragma: no cover - torch without dynamo
        return False
    remove_from_cache(code)  # a code object: resets its cache alone, never process-wide
    return True


def sparse_values(grad: torch.Tensor) -> torch.Tensor:
    """The values of a sparse tensor after coalescing (entries of repeated indices summed):
    torch's own accessor for them is private."""
    return grad.coalesce()._values()
