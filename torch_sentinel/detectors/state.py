"""A detector's windows across a checkpoint: the host state it keeps between flushes.

A detector keeps plain host values between windows (counters, deques of recent figures, the
smoothed loss curve, verdicts already given). Those are what a resumed run needs to go on
judging the same curve; anything that points at the live run (the run context, probes, device
tensors, pending device copies) is rebuilt by ``attach()`` and is left out.
"""

from __future__ import annotations

import collections
import copy
from typing import Any

import numpy as np
import torch

from .._collect.probe import Probe

__all__ = ["host_state", "restore_state"]

#: Attributes that belong to the live run, never to a checkpoint.
_LIVE = frozenset({"ctx", "host"})
#: Attributes named ``*_cache`` are derived from the live run (index arrays over the record
#: layout) and rebuilt on demand: never checkpointed, never restored.
_CACHE_SUFFIX = "_cache"


def _live(name: str) -> bool:
    return name in _LIVE or name.endswith(_CACHE_SUFFIX)


def _portable(value: Any, depth: int = 0) -> bool:
    """Plain host data: numbers, strings, numpy arrays, containers of them, and small objects
    of this package made only of those (e.g. ``SmoothedLoss``)."""
    if value is None or isinstance(value, (bool, int, float, str, bytes, np.generic, np.ndarray)):
        return True
    if isinstance(value, (torch.Tensor, Probe)) or depth > 4:
        return False
    if isinstance(value, (list, tuple, set, frozenset, collections.deque)):
        return all(_portable(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(_portable(k, depth + 1) and _portable(v, depth + 1) for k, v in value.items())
    if not type(value).__module__.startswith("torch_sentinel"):
        return False
    fields = _fields(value)
    return fields is not None and all(_portable(v, depth + 1) for v in fields.values())


def _fields(value: Any) -> dict[str, Any] | None:
    if hasattr(value, "__dict__"):
        return dict(vars(value))
    slots = getattr(type(value), "__slots__", None)
    if slots is None:
        return None
    return {name: getattr(value, name) for name in slots if hasattr(value, name)}


def host_state(detector: Any) -> dict[str, Any]:
    """A deep copy of the detector's portable attributes."""
    return {k: copy.deepcopy(v) for k, v in vars(detector).items() if not _live(k) and _portable(v)}


def restore_state(detector: Any, state: dict[str, Any]) -> None:
    """Put back what :func:`host_state` saved, for the attributes this detector still has."""
    own = vars(detector)
    for key, value in state.items():
        if key in own and not _live(key):
            setattr(detector, key, copy.deepcopy(value))
