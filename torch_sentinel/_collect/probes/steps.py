"""Host facts of each optimizer step: the learning rate of every param group, and (with several
optimizers) which of them stepped in the row (``meta.stepped``, their indices)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import torch

from ..probe import Probe, ProbeHost

__all__ = ["StepProbe"]


class StepProbe(Probe):
    name = "steps"

    def setup(self, host: ProbeHost) -> None:
        self.host = host

    def on_post_step(self, optimizer: torch.optim.Optimizer) -> None:
        meta, optimizers = self.host.meta, self.host.optimizers
        meta.lrs.extend(_lr(g) for g in optimizer.param_groups)
        if len(optimizers) == 1:
            meta.lr_names.extend(str(g.get("name", f"group{i}")) for i, g in enumerate(optimizer.param_groups))
        else:
            k = optimizers.index(optimizer)
            meta.stepped.append(k)
            meta.lr_names.extend(f"opt{k}.{g.get('name', f'group{i}')}" for i, g in enumerate(optimizer.param_groups))


def _lr(group: Mapping[str, Any]) -> Optional[float]:
    lr = group.get("lr")
    if isinstance(lr, torch.Tensor):
        return None  # a tensor lr would need a device read; it is not logged
    return float(lr) if lr is not None else None
