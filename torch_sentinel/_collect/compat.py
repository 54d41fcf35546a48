"""What differs across the torch versions we support (torch >= 2.4)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Optional

import torch

__all__ = ["forward_hooks", "is_compiling"]

#: True while torch.compile traces a hook: host-side bookkeeping must be skipped then.
is_compiling: Callable[[], bool] = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


def forward_hooks(module: torch.nn.Module) -> Optional[Mapping[int, Any]]:
    """The module's forward hooks by handle id, in the order torch runs them; None where this
    torch keeps them elsewhere. There is no public way to keep a hook last (``prepend`` only
    places a hook when it is registered), so the order is read from torch's own dict."""
    hooks = getattr(module, "_forward_hooks", None)
    return hooks if isinstance(hooks, Mapping) else None
