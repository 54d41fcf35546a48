"""What differs across the torch versions we support (torch >= 2.4)."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch.utils.hooks import RemovableHandle

__all__ = ["forward_hooks", "hook_handles_made", "is_compiling"]

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
