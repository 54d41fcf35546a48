"""A detector's windows across a checkpoint: the host state it keeps between flushes.

A detector keeps host values between windows (counters, deques of recent figures, the smoothed
loss curve, verdicts already given). Those are what a resumed run needs to go on judging the
same curve, and every one of them is saved, as plain data (``torch_sentinel/_plain.py``).

What belongs to the live run is rebuilt by ``attach()`` and never saved. It is named, not
guessed: a class lists such attributes in ``live_attributes`` (the run context, the probe host,
references into the model, pending device copies; the lists of every class in the MRO count),
an attribute named ``*_cache`` is derived on demand, and an attribute named after one of the
detector's ``thresholds`` is the new run's configuration. A probe the detector holds (a
dead-unit mask, a constant-feature mask) is saved with the same rules and restored into the
new run's probe in place. Any other value that is not plain data is an error at
``state_dict()`` naming the detector and the attribute.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .._collect.probe import Probe
from .._plain import CACHE_SUFFIX, PlainStateError, decode, encode

__all__ = ["host_state", "live_attributes", "restore_state"]

#: Marks a saved probe (restored in place into the new run's probe of the same class).
_PROBE = "__probe__"


def live_attributes(obj: Any) -> frozenset[str]:
    """The attributes of ``obj`` that ``attach()`` rebuilds: never saved, never restored."""
    names: set[str] = set()
    for klass in type(obj).__mro__:
        names.update(klass.__dict__.get("live_attributes", ()))
        names.update(klass.__dict__.get("thresholds", {}).keys())
    return frozenset(names)


def _saved_attributes(obj: Any) -> dict[str, Any]:
    live = live_attributes(obj)
    return {k: v for k, v in vars(obj).items() if k not in live and not k.endswith(CACHE_SUFFIX)}


def host_state(detector: Any) -> dict[str, Any]:
    """The detector's host state as plain data (see the module docstring).

    Raises:
        PlainStateError: an attribute holds something that is not plain data.
    """
    state: dict[str, Any] = {}
    for name, value in _saved_attributes(detector).items():
        where = f"detector {detector.kind!r}: {name}"
        if isinstance(value, Probe) and value is not detector:
            state[name] = {_PROBE: type(value).__qualname__,
                           "fields": {k: encode(v, f"{where}.{k}") for k, v in _saved_attributes(value).items()}}
        else:
            state[name] = encode(value, where)
    return state


def restore_state(detector: Any, state: dict[str, Any], device: Optional[torch.device] = None) -> None:
    """Put back what :func:`host_state` saved (also attributes a detector creates lazily).

    Args:
        detector: a fresh detector of the same kind, set up by ``attach()``.
        state: what :func:`host_state` returned.
        device: where saved tensors go (the run's device).
    """
    live = live_attributes(detector)
    for name, data in state.items():
        if name in live or name.endswith(CACHE_SUFFIX) or callable(getattr(type(detector), name, None)):
            continue  # rebuilt by attach(), or a method: never data to restore
        where = f"detector {detector.kind!r}: {name}"
        target = vars(detector).get(name)
        if isinstance(data, dict) and _PROBE in data:
            if not isinstance(target, Probe) or type(target).__qualname__ != data[_PROBE]:
                raise PlainStateError(f"Sentinel.load_state_dict(): {where} was a {data[_PROBE]} when saved, "
                                      f"but this run has a {type(target).__qualname__}: save the state again")
            fields = _saved_attributes(target)
            for key, value in data["fields"].items():
                if key in fields:
                    setattr(target, key, decode(value, f"{where}.{key}", device))
        else:
            setattr(detector, name, decode(data, where, device))
