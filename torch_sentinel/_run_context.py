"""The run context the detectors read: static facts about the attached model and optimizers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

import torch

from ._collect.collector import Collector
from .detectors import RunContext

__all__ = ["run_context"]


def run_context(c: Collector, optimizers: list[torch.optim.Optimizer], thresholds: Mapping[str, float],
                rank: Optional[int]) -> RunContext:
    """What the detectors may know of the run ``c`` watches (built once, at ``attach()``)."""
    held = {id(q) for o in optimizers for g in o.param_groups for q in g["params"]}
    names = {id(p): n for n, p in c.params}
    return RunContext(
        module_names=c.module_names,
        module_types={n: type(m).__name__ for n, m in c.map.modules},
        param_names=[n for n, _ in c.params],
        param_owner={n: c.map.param_owner.get(n, n.rpartition(".")[0]) for n, _ in c.params},
        # Without an optimizer the loop updates the weights itself: every trainable parameter
        # is then "held" (no_update and no_gradient watch them all).
        optimizer_params={n for n, p in c.params if id(p) in held} if optimizers
        else {n for n, p in c.params if p.requires_grad},
        forward_order=c.forward_order,
        thresholds=dict(thresholds),
        rank=rank,
        exact_norms=c.ledger.host_view is not None,
        adversarial=lambda: c.adversarial,
        optimizer_groups=[[names[id(q)] for g in o.param_groups for q in g["params"] if id(q) in names]
                          for o in optimizers],
        optimizer_types=[type(o).__name__ for o in optimizers],
        trainable={n for n, p in c.params if p.requires_grad},
        param_dtypes={n: p.dtype for n, p in c.params},
        in_progress=c.step_in_progress,
    )
