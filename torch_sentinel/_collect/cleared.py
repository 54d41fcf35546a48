"""Which watched gradients a ``zero_grad()`` cleared, whatever ``set_to_none`` said.

A backward that reaches the model while earlier ones are pending, after their gradients were
cleared, drops them (a GAN's generator loss reaches the discriminator, whose ``zero_grad()``
then throws those gradients away). Gradients set to None show it by themselves; gradients
zeroed in place (``zero_grad(set_to_none=False)``) do not, short of reading them (a device
sync). So ``Module.zero_grad`` and ``Optimizer.zero_grad`` are observed instead: the ids of the
parameters they cleared are host bookkeeping.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .model_map import ModelMap

__all__ = ["ClearedGrads"]


class ClearedGrads:
    """Parameters whose gradients were cleared since the last backward that reached the model.

    Args:
        model_map: the attached model's names (a module of the model is one it names).
        optimizers: the watched optimizers.
        params: the watched trainable tensors.
    """

    def __init__(self, model_map: ModelMap, optimizers: list[torch.optim.Optimizer],
                 params: list[torch.Tensor]) -> None:
        self._map = model_map
        self._optimizers = optimizers
        self._params = params
        self._zeroed: set[int] = set()

    def note(self, owner: Any) -> None:
        """``owner.zero_grad()`` returned: a module of the model, an optimizer, or neither."""
        if isinstance(owner, nn.Module):
            if self._map.name_of(owner) is None:
                return
            params: Any = owner.parameters()
        elif any(owner is o for o in self._optimizers):
            params = (p for g in owner.param_groups for p in g["params"])
        else:
            return
        self._zeroed.update(id(p) for p in params)

    def everything(self) -> bool:
        """Whether every watched gradient is None or was cleared by a ``zero_grad()``."""
        zeroed = self._zeroed
        return all(p.grad is None or id(p) in zeroed for p in self._params)

    def reset(self) -> None:
        self._zeroed = set()
