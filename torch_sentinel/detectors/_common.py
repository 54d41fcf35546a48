"""Small host-side helpers shared by several detectors."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

from .._collect.graph_walk import LossGraph
from .._record import StepRecord

__all__ = ["GraphCut", "common_module", "trained"]


def trained(record: StepRecord) -> bool:
    """Whether the record is a real optimizer step: a backward ran and the AMP scaler did not
    skip the step."""
    return record.meta.backward_calls > 0 and not record.meta.amp_skipped


class GraphCut:
    """New leaves between the model and the loss, over the walks of the loss's graph so far:
    a tensor rebuilt from the model's output cut the graph there (``graph_walk.py``)."""

    def __init__(self) -> None:
        #: (shape, step) of the first few cut leaves.
        self.leaves: list[tuple[list[int], int]] = []
        #: Whether every walk that found a cut also reached the model's parameters.
        self.reached_params = True

    def add(self, record: StepRecord) -> None:
        walk = record.fact(LossGraph)
        if walk is None or not walk.cut_leaves:
            return
        for shape in walk.cut_leaves:
            if len(self.leaves) < 8:
                self.leaves.append((list(shape), record.step))
        self.reached_params = self.reached_params and walk.reached_params

    @property
    def cut_off(self) -> bool:
        """The loss's graph starts at new leaves and never reached the parameters."""
        return bool(self.leaves) and not self.reached_params


def common_module(owners: Iterable[Optional[str]]) -> str:
    """The deepest module containing all ``owners`` ("" is the root)."""
    parts: Optional[list[str]] = None
    for owner in owners:
        p = (owner or "").split(".") if owner else []
        if parts is None:
            parts = p
        else:
            n = 0
            while n < min(len(parts), len(p)) and parts[n] == p[n]:
                n += 1
            parts = parts[:n]
    return ".".join(parts or [])
