"""The demo's cases: the seeds' lab (shape, dead_relu, no_update, overfit) plus a non-finite
case and a healthy control, each a real small training with one realistic bug.

Every case is an ordinary training loop with ``torch_sentinel.attach`` added, the one line a
user adds; the bug sits where it would sit in a user's code, marked ``# BUG``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Callable, Optional

import torch
from torch import nn

import torch_sentinel

from ..diagnosis import Report
from ..diagnosis.ladder import HEALTHY_NEXT_CHECK, kind_info

__all__ = ["CASES", "Case"]

_FEATURES = 16
_CLASSES = 4


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    #: What the lab expects the diagnosis to be, in the seeds' vocabulary.
    expected: str
    #: One line on the bug planted in the loop.
    bug: str
    train: Callable[[str], Report]


class _Net(nn.Module):
    """A small classifier; named layers so that findings read ``fc1``, not ``0``."""

    def __init__(self, d_in: int = _FEATURES, hidden: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.act1 = nn.ReLU()
        self.fc2 = nn.Linear(hidden, hidden)
        self.act2 = nn.ReLU()
        self.head = nn.Linear(hidden, _CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act2(self.fc2(self.act1(self.fc1(x)))))


def _mlp(d_in: int = _FEATURES, hidden: int = 32) -> _Net:
    return _Net(d_in, hidden)


def _task(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable task: labels from a fixed random linear teacher."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(_FEATURES, _CLASSES, generator=torch.Generator().manual_seed(1234))
    x = torch.randn(n, _FEATURES, generator=g)
    return x, (x @ teacher).argmax(1)


def _batches(
    x: torch.Tensor, y: torch.Tensor, steps: int, batch: int = 32
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    for step in range(steps):
        i = (step * batch) % len(x)
        yield step, x[i : i + batch], y[i : i + batch]


def _healthy(log_dir: str) -> Report:
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = _task(512, seed=0)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=20) as sentinel:
        for _, xb, yb in _batches(x, y, 80):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
        return sentinel.report()


def _shape(log_dir: str) -> Report:
    torch.manual_seed(0)
    model = _mlp(d_in=_FEATURES)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _task(256, seed=0)
    x = x[:, :12]  # BUG: the data pipeline dropped four feature columns
    with torch_sentinel.attach(model, opt, log_dir=log_dir) as sentinel:
        try:
            for _, xb, yb in _batches(x, y, 5):
                opt.zero_grad()
                nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
        except RuntimeError:
            pass  # the training stops here, as it would for the user
        return sentinel.report()


def _dead_relu(log_dir: str) -> Report:
    torch.manual_seed(0)
    model = _mlp()
    with torch.no_grad():
        model.fc1.bias.fill_(-8.0)  # BUG: an initialisation that puts every unit below zero
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = _task(512, seed=0)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=20) as sentinel:
        for _, xb, yb in _batches(x, y, 60):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
        return sentinel.report()


def _no_update(log_dir: str) -> Report:
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = _task(512, seed=0)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=20) as sentinel:
        for _, xb, yb in _batches(x, y, 60):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            # BUG: "resume" code that reloads the start weights after every step
            model.load_state_dict(initial)
        return sentinel.report()


def _overfit(log_dir: str) -> Report:
    torch.manual_seed(0)
    model = _mlp(hidden=128)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    # BUG: 32 training examples with noisy labels for a model with 20k parameters.
    x, _ = _task(32, seed=0)
    y = torch.randint(0, _CLASSES, (32,), generator=torch.Generator().manual_seed(1))
    xv, yv = _task(256, seed=1)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=20) as sentinel:
        for step in range(200):
            if step % 10 == 0:
                with torch.no_grad():
                    sentinel.observe_validation(nn.functional.cross_entropy(model(xv), yv))
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return sentinel.report()


class _LogFeatures(nn.Module):
    """Log-scaled count features, as a user might write them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class _CountNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = _LogFeatures()
        self.classifier = _mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _nonfinite(log_dir: str) -> Report:
    torch.manual_seed(0)
    model = _CountNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = _task(512, seed=0)
    x = x.abs() + 0.5
    x[7 * 32 + 3, 2] = 0.0  # BUG: one count of zero in batch 7 and no epsilon before the log
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=20) as sentinel:
        try:
            for _, xb, yb in _batches(x, y, 30):
                opt.zero_grad()
                nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
        except torch_sentinel.NonFiniteError:
            pass  # the sentinel stopped the run at the first non-finite value
        return sentinel.report()


def _expected(kind: str) -> str:
    info = kind_info(kind)
    assert info is not None, kind
    return info.next_check


CASES: tuple[Case, ...] = (
    Case(
        "shape",
        _expected("shape_mismatch"),
        "the data pipeline drops 4 of 16 feature columns",
        _shape,
    ),
    Case("dead_relu", _expected("dead_relu"), "the first layer's bias starts at -8", _dead_relu),
    Case(
        "no_update",
        _expected("no_update"),
        "the start weights are reloaded after every step",
        _no_update,
    ),
    Case(
        "overfit", _expected("overfitting"), "32 noisy examples for a 20k-parameter model", _overfit
    ),
    Case(
        "nonfinite",
        "inspect_forward_values",
        "log() of a feature that is 0 in one batch",
        _nonfinite,
    ),
    Case("healthy", HEALTHY_NEXT_CHECK, "none: the control run", _healthy),
)


def find_case(name: str) -> Optional[Case]:
    return next((c for c in CASES if c.name == name), None)
