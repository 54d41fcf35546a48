"""Framework wrappers around optimizers: the step hooks must sit on the object that steps."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["unwrap_optimizer"]


def unwrap_optimizer(opt: Any) -> Any:
    """The innermost ``torch.optim.Optimizer`` inside a framework's wrapper (accelerate's
    ``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``), else ``opt`` itself.

    ``AcceleratedOptimizer`` subclasses ``Optimizer`` without initialising it, so an
    ``isinstance`` check alone would accept an object whose hooks never fire.
    """
    for _ in range(4):
        inner = getattr(opt, "optimizer", None) or getattr(opt, "_optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer) or inner is opt:
            break
        opt = inner
    return opt
