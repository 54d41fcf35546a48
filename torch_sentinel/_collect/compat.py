"""What differs across the torch versions we support (torch >= 2.4)."""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["is_compiling"]

#: True while torch.compile traces a hook: host-side bookkeeping must be skipped then.
is_compiling: Callable[[], bool] = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
