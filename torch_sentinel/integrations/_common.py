"""What the framework callbacks share: unwrapping optimizers, detaching quietly."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Optional

import torch

from .._api import Sentinel

__all__ = ["detach_quietly", "torch_optimizers"]

logger = logging.getLogger("torch_sentinel")


def torch_optimizers(optimizers: Iterable[Any]) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside framework wrappers (accelerate's ``AcceleratedOptimizer``,
    Lightning's ``LightningOptimizer``): the step hooks must sit on the object that steps."""
    found = []
    for opt in optimizers:
        # AcceleratedOptimizer subclasses Optimizer without initialising it: unwrap to the
        # innermost optimizer, whatever the wrapper's type.
        for _ in range(4):
            inner = getattr(opt, "optimizer", None) or getattr(opt, "_optimizer", None)
            if not isinstance(inner, torch.optim.Optimizer) or inner is opt:
                break
            opt = inner
        if isinstance(opt, torch.optim.Optimizer):
            found.append(opt)
    return found


def detach_quietly(sentinel: Optional[Sentinel]) -> None:
    """Detach while another exception may be propagating: never mask it."""
    if sentinel is None or not sentinel.attached:
        return
    try:
        sentinel._detach(quiet=True)
    except Exception as exc:
        logger.debug("torch_sentinel: detach after an exception failed: %s", exc)
