"""Host state as plain data, for checkpoints that ``torch.load(..., weights_only=True)`` reads.

A checkpoint holds only tensors, numbers, strings, lists, dicts, None and bools. What a detector
keeps besides those (tuples, sets, deques, numpy arrays and scalars, torch dtypes and sizes,
small objects of this package such as a smoothed loss curve) is encoded as a dict with a type
tag and decoded back to an equal value of the same type. Anything else is refused when it is
encoded, with the path of the value, never silently left out.

Decoding never imports a module and never calls a constructor named by the data: the tagged
containers are built-in types, and an object of this package is created with ``__new__`` from a
class whose module is already imported, then filled field by field.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
from typing import Any, Optional

import numpy as np
import torch

from ._errors import SentinelError, format_message

__all__ = ["TAG", "PlainStateError", "decode", "encode"]

#: The key that marks an encoded value; a dict whose keys are strings other than this one is
#: stored as itself.
TAG = "__plain__"
_PACKAGE = __name__.partition(".")[0]
_MAX_DEPTH = 32
_SCALARS = (bool, int, float, str, type(None))
#: An attribute named ``*_cache`` holds values derived on demand: never saved.
CACHE_SUFFIX = "_cache"


class PlainStateError(SentinelError):
    """A value cannot be saved as plain data, or saved data cannot be read back."""


def encode(value: Any, where: str) -> Any:
    """``value`` as tensors, numbers, strings, lists, dicts, None and bools.

    Args:
        value: the host value to save.
        where: its path, for the error (``"detector 'dead_relu': watch.sites"``).
    """
    return _encode(value, where, 0)


def decode(data: Any, where: str, device: Optional[torch.device] = None) -> Any:
    """The value :func:`encode` saved.

    Args:
        data: what :func:`encode` returned (after a round trip through ``torch.save``).
        where: its path, for the error.
        device: where tensors go (the run's device), or None to leave them where they are.
    """
    return _decode(data, where, device, 0)


def _refuse(where: str, value: Any, why: str) -> PlainStateError:
    kind = type(value)
    return PlainStateError(format_message(
        f"Sentinel.state_dict() cannot save {where}: {why}",
        expected="tensors, numbers, strings, None, bools, and lists, tuples, dicts, sets, deques, numpy "
                 f"arrays and scalars, torch dtypes or small objects of {_PACKAGE} made of those",
        arrived=f"{kind.__module__}.{kind.__qualname__}",
        next_check="a detector keeps plain host state: if attach() rebuilds this attribute, name it in "
                   "the live_attributes of its class; else keep plain values in it",
    ))


def _encode(value: Any, where: str, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise _refuse(where, value, f"nested deeper than {_MAX_DEPTH} levels (a reference cycle?)")
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is torch.Tensor:
        # A snapshot: the live tensor (an alive mask) goes on changing in place after this.
        return value.detach().clone()
    if kind is list:
        return [_encode(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if kind is dict:
        if all(type(k) is str for k in value) and TAG not in value:
            return {k: _encode(v, f"{where}[{k!r}]", depth + 1) for k, v in value.items()}
        return _tagged("dict", [[_encode(k, f"{where} key", depth + 1), _encode(v, f"{where}[{k!r}]", depth + 1)]
                                for k, v in value.items()])
    if kind in (tuple, set, frozenset, torch.Size):
        items = value if kind in (tuple, torch.Size) else _stable_order(value)
        return _tagged(kind.__name__, [_encode(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(items)])
    if kind is collections.deque:
        return {**_tagged("deque", [_encode(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]),
                "maxlen": value.maxlen}
    if kind is torch.dtype:
        return {TAG: "dtype", "name": str(value).removeprefix("torch.")}
    if isinstance(value, np.ndarray) and kind is np.ndarray:
        return _encode_array(value, where)
    if isinstance(value, np.generic):
        return {TAG: "numpy_scalar", "dtype": value.dtype.str,
                "value": _encode(value.item(), where, depth + 1)}
    fields = _own_fields(value)
    if fields is not None:
        return {TAG: "object", "class": f"{kind.__module__}:{kind.__qualname__}",
                "fields": {k: _encode(v, f"{where}.{k}", depth + 1) for k, v in fields.items()}}
    raise _refuse(where, value, "it is not plain host data")


def _tagged(tag: str, items: list[Any]) -> dict[str, Any]:
    return {TAG: tag, "items": items}


def _stable_order(items: Any) -> list[Any]:
    """A set's members in a fixed order when they can be sorted (the saved file is the same
    for the same state), else in iteration order."""
    try:
        return sorted(items)
    except TypeError:
        return list(items)


def _encode_array(value: np.ndarray, where: str) -> dict[str, Any]:
    try:
        data = torch.from_numpy(np.array(value, copy=True, order="C"))
    except TypeError as exc:
        raise _refuse(where, value, f"numpy dtype {value.dtype} has no torch equivalent") from exc
    return {TAG: "ndarray", "dtype": value.dtype.str, "data": data}


def _own_fields(value: Any) -> Optional[dict[str, Any]]:
    """The fields of a small object of this package (a dataclass, or a class with plain
    attributes or ``__slots__``), less its ``*_cache`` ones; None for anything else."""
    kind = type(value)
    if not kind.__module__.startswith(_PACKAGE + ".") or isinstance(value, type):
        return None
    if dataclasses.is_dataclass(value):
        names = [f.name for f in dataclasses.fields(value)]
    elif hasattr(value, "__dict__"):
        names = list(vars(value))
    else:
        slots = [s for klass in kind.__mro__ for s in getattr(klass, "__slots__", ())]
        if not slots:
            return None
        names = [s for s in slots if s != "__weakref__" and hasattr(value, s)]
    return {n: getattr(value, n) for n in names if not n.endswith(CACHE_SUFFIX)}


def _decode(data: Any, where: str, device: Optional[torch.device], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise _unreadable(where, f"nested deeper than {_MAX_DEPTH} levels")
    kind = type(data)
    if kind in _SCALARS:
        return data
    if isinstance(data, torch.Tensor):
        return data if device is None else data.to(device)
    if kind is list:
        return [_decode(v, f"{where}[{i}]", device, depth + 1) for i, v in enumerate(data)]
    if kind is not dict:
        raise _unreadable(where, f"a {kind.__name__} where plain data was expected")
    if TAG not in data:
        return {k: _decode(v, f"{where}[{k!r}]", device, depth + 1) for k, v in data.items()}
    tag = data[TAG]
    items = [_decode(v, f"{where}[{i}]", device, depth + 1) for i, v in enumerate(data.get("items", ()))]
    if tag == "dict":
        return {k: v for k, v in items}
    if tag in _CONTAINERS:
        return _CONTAINERS[tag](items)
    if tag == "deque":
        return collections.deque(items, maxlen=data["maxlen"])
    if tag == "dtype":
        dtype = getattr(torch, str(data["name"]), None)
        if not isinstance(dtype, torch.dtype):
            raise _unreadable(where, f"unknown torch dtype {data['name']!r}")
        return dtype
    if tag == "ndarray":
        return data["data"].cpu().numpy().astype(np.dtype(data["dtype"]), copy=True)
    if tag == "numpy_scalar":
        return np.dtype(data["dtype"]).type(_decode(data["value"], where, device, depth + 1))
    if tag == "object":
        return _decode_object(data, where, device, depth)
    raise _unreadable(where, f"unknown tag {tag!r}")


_CONTAINERS: dict[str, Any] = {"tuple": tuple, "set": set, "frozenset": frozenset, "Size": torch.Size}


def _decode_object(data: dict[str, Any], where: str, device: Optional[torch.device], depth: int) -> Any:
    module_name, _, qualname = str(data["class"]).partition(":")
    module = sys.modules.get(module_name) if module_name.startswith(_PACKAGE + ".") else None
    kind: Any = module
    for part in qualname.split("."):
        kind = getattr(kind, part, None)
    if module is None or not isinstance(kind, type) or kind.__module__ != module_name:
        raise _unreadable(where, f"class {data['class']!r} is not a loaded class of {_PACKAGE}")
    obj: Any = object.__new__(kind)  # no constructor of the class runs
    for name, value in data["fields"].items():
        object.__setattr__(obj, name, _decode(value, f"{where}.{name}", device, depth + 1))
    return obj


def _unreadable(where: str, why: str) -> PlainStateError:
    return PlainStateError(format_message(
        f"Sentinel.load_state_dict() cannot read {where}: {why}",
        expected="the plain data Sentinel.state_dict() wrote",
        next_check="pass the dict that state_dict() returned, unchanged; save it again if it came "
                   "from another version of torch_sentinel",
    ))
