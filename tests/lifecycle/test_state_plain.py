"""Sentinel.state_dict() is plain data: tensors, numbers, strings, lists, dicts, None and bools,
so a checkpoint holding it loads with ``torch.load(..., weights_only=True)`` and nothing is ever
unpickled. Every built-in detector's windows, counters and verdicts come back identical after a
real training run, and a run resumed from the checkpoint reports what the uninterrupted run
reports, step for step."""

from __future__ import annotations

import collections
import io
import math
import pathlib
import pickle
from typing import Any, Optional

import numpy as np
import pytest
import torch
from torch import nn

import torch_sentinel
from torch_sentinel import SentinelError
from torch_sentinel._lifecycle import STATE_FORMAT
from torch_sentinel._plain import PlainStateError, decode, encode
from torch_sentinel.detectors import builtin_detectors
from torch_sentinel.detectors.state import live_attributes

STEPS, CUT = 120, 50
KINDS = [d.kind for d in builtin_detectors()]


class Net(nn.Module):
    """A body and a head with their own optimizers; ReLU, Tanh, dropout and BatchNorm, so that
    every detector (and the probes holding its windows) has state after a few dozen steps."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.relu = nn.ReLU()
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(32, 16)
        self.tanh = nn.Tanh()
        self.norm = nn.BatchNorm1d(16)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.tanh(self.fc2(self.drop(self.relu(self.fc1(x)))))))


def _fresh() -> tuple[Net, list[torch.optim.Optimizer]]:
    torch.manual_seed(0)
    model = Net()
    body = [p for n, p in model.named_parameters() if not n.startswith("head")]
    return model, [torch.optim.Adam(body, lr=1e-2), torch.optim.SGD(model.head.parameters(), lr=0.05)]


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    data = []
    for _ in range(STEPS):
        x = torch.randn(16, 12, generator=g) * 40 + 5  # far from unit scale: input windows fill
        x[:, 3] = 2.0  # a constant feature
        data.append((x, torch.randint(0, 4, (16,), generator=g)))
    return data


def _train(model: Net, opts: list[torch.optim.Optimizer], sentinel: Any, steps: range) -> None:
    data = _batches()
    for i in steps:
        x, y = data[i]
        if i == 35:
            with torch.no_grad():
                model.fc1.bias[4:].fill_(-1e4)  # most ReLU units die: dead_relu's window 40-59 spans the cut
        if i == 70:
            opts[1].param_groups[0]["lr"] = 20.0  # the head's updates blow up: update_ratio, diverging
        for opt in opts:
            opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        for opt in opts:
            opt.step()
        if i % 10 == 9:
            sentinel.observe_validation(1.0 + i / 100)  # a rising validation loss: overfitting's curve


def _assert_plain(value: Any, path: str = "state") -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            assert type(k) is str, f"{path}: key {k!r}"
            _assert_plain(v, f"{path}[{k!r}]")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _assert_plain(v, f"{path}[{i}]")
    else:
        assert type(value) in (torch.Tensor, int, float, str, bool, type(None)), f"{path}: {type(value)}"


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same types, all the way down (NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and a.device == b.device and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    if isinstance(a, collections.deque) and a.maxlen != b.maxlen:
        return False
    if isinstance(a, (list, tuple, collections.deque)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if type(a).__module__.startswith("torch_sentinel."):
        return _same(_fields(a), _fields(b))
    return bool(a == b)


def _fields(obj: Any) -> dict[str, Any]:
    """An object's state: its fields less the ``*_cache`` ones (derived on demand, never saved)."""
    slots = [s for k in type(obj).__mro__ for s in getattr(k, "__slots__", ()) if hasattr(obj, s)]
    fields = {**{s: getattr(obj, s) for s in slots}, **getattr(obj, "__dict__", {})}
    return {k: v for k, v in fields.items() if not k.endswith("_cache")}


def _saved(obj: Any) -> dict[str, Any]:
    """The attributes a checkpoint carries: every one except those attach() rebuilds."""
    live = live_attributes(obj)
    return {k: v for k, v in vars(obj).items() if k not in live and not k.endswith("_cache")}


def _checkpoint(sentinel: Any) -> dict[str, Any]:
    buf = io.BytesIO()
    torch.save({"sentinel": sentinel.state_dict()}, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)["sentinel"]


@pytest.fixture(scope="module")
def trained() -> tuple[Any, dict[str, Any]]:
    model, opts = _fresh()
    sentinel = torch_sentinel.attach(model, opts)
    _train(model, opts, sentinel, range(CUT))
    state = sentinel.state_dict()
    yield sentinel, state
    sentinel.detach()


def test_state_dict_is_plain_data_and_loads_with_weights_only(trained: tuple[Any, dict[str, Any]]) -> None:
    sentinel, state = trained
    _assert_plain(state)
    assert state["format"] == STATE_FORMAT and sorted(state["detectors"]) == sorted(KINDS)
    restored = _checkpoint(sentinel)
    _assert_plain(restored)


@pytest.mark.parametrize("kind", KINDS, ids=KINDS)
def test_every_detector_comes_back_identical(kind: str, trained: tuple[Any, dict[str, Any]]) -> None:
    sentinel, _ = trained
    saved = _checkpoint(sentinel)
    (before,) = [d for d in sentinel._detectors if d.kind == kind]
    model, opts = _fresh()
    with torch_sentinel.attach(model, opts) as resumed:
        resumed.load_state_dict(saved)
        (after,) = [d for d in resumed._detectors if d.kind == kind]
        assert resumed.step == CUT
        want, got = _saved(before), _saved(after)
        assert list(got) == list(want)
        for name, value in want.items():
            probe = isinstance(value, torch_sentinel._collect.probe.Probe) and value is not before
            if probe:
                assert _same(_saved(got[name]), _saved(value)), f"{kind}.{name}"
            else:
                assert _same(got[name], value), f"{kind}.{name}: {got[name]!r} != {value!r}"
        assert after.statistics() == before.statistics()


def _report(findings: list[torch_sentinel.Finding]) -> list[tuple[Any, ...]]:
    return sorted((f.kind, f.module or "", f.step, f.onset_step, f.severity, f.message) for f in findings)


def test_resumed_run_reports_exactly_what_the_uninterrupted_run_reports() -> None:
    model, opts = _fresh()
    with torch_sentinel.attach(model, opts) as whole:
        _train(model, opts, whole, range(STEPS))
    expected = _report(whole.report().findings)
    kinds = {f[0] for f in expected}
    # verdicts whose windows span the cut (dead units, the validation and loss curves, update
    # ratios against the run's first ones), and verdicts given before it (not repeated)
    assert {"dead_relu", "diverging", "overfitting", "update_ratio", "saturation", "unnormalized_input"} <= kinds
    assert [f[2] for f in expected if f[0] in ("dead_relu", "diverging", "overfitting", "update_ratio")] > [CUT] * 4

    model, opts = _fresh()
    first = torch_sentinel.attach(model, opts)
    _train(model, opts, first, range(CUT))
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizers": [o.state_dict() for o in opts],
                "rng": torch.get_rng_state(), "sentinel": first.state_dict()}, buf)
    first.detach()
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    model, opts = _fresh()
    model.load_state_dict(ckpt["model"])
    for opt, saved in zip(opts, ckpt["optimizers"]):
        opt.load_state_dict(saved)
    torch.set_rng_state(ckpt["rng"])  # the dropout masks go on as in the uninterrupted run
    with torch_sentinel.attach(model, opts) as second:
        second.load_state_dict(ckpt["sentinel"])
        _train(model, opts, second, range(CUT, STEPS))
    assert _report(second.report().findings) == expected


def test_a_state_of_the_pickled_format_is_refused_without_unpickling(tmp_path: pathlib.Path) -> None:
    class Bomb:
        def __reduce__(self) -> Any:
            return (pathlib.Path.touch, (tmp_path / "ran",))

    old = {"format": 1, "step": 3, "nonfinite_reported": False, "findings": [],
           "detectors": pickle.dumps({"plateau": Bomb()})}
    model, opts = _fresh()
    refused = pytest.raises(SentinelError, match=r"older torch_sentinel \(format 1\)(.|\n)*save "
                                                 r"sentinel.state_dict\(\) again")
    with torch_sentinel.attach(model, opts) as s, refused:
        s.load_state_dict(old)
    assert not (tmp_path / "ran").exists()


class _Holder:
    pass


@pytest.mark.parametrize(
    "value",
    [(1, "a", None), {3, 1, 2}, frozenset({"x"}), collections.deque([1.5, float("nan")], maxlen=4),
     np.arange(6, dtype=np.float32).reshape(2, 3), np.float32(0.1), np.int64(7), np.bool_(True),
     {(1, "a"): [2.0], "__plain__": 1}, torch.Size([2, 3]), torch.bfloat16, torch.arange(3)],
    ids=["tuple", "set", "frozenset", "deque", "ndarray", "float32", "int64", "bool_", "odd-keys", "size",
         "dtype", "tensor"],
)
def test_the_encoding_round_trips_exactly(value: Any) -> None:
    data = encode(value, "x")
    _assert_plain(data)
    assert _same(decode(data, "x"), value)


@pytest.mark.parametrize("value", [lambda: 0, _Holder(), np.array(["a"], dtype=object), nn.Linear(1, 1)],
                         ids=["function", "foreign-object", "object-array", "module"])
def test_what_is_not_plain_is_an_error_that_names_the_attribute(value: Any) -> None:
    model, opts = _fresh()
    with torch_sentinel.attach(model, opts) as s:
        (plateau,) = [d for d in s._detectors if d.kind == "plateau"]
        plateau.extra_window = {"points": [value]}
        with pytest.raises(PlainStateError, match=r"cannot save detector 'plateau': extra_window\['points'\]\[0\]"
                                                  r"(.|\n)*live_attributes"):
            s.state_dict()


def test_decoding_creates_only_loaded_classes_of_the_package() -> None:
    data: Optional[dict[str, Any]] = {"__plain__": "object", "class": "os:system", "fields": {}}
    with pytest.raises(PlainStateError, match="not a loaded class of torch_sentinel"):
        decode(data, "x")
