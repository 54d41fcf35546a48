"""The sentinel's host bookkeeping must not make Python's garbage collector run more often.

A collection that starts while a step's objects are alive (the gradients' Python wrappers,
hundreds on a large model) carries them into older generations, and the oldest generation's
full collections cost hundreds of milliseconds in a process the size of a training job (about
150 ms on the 500-module benchmark stack; torchtitan disables the collector for that reason).
The collector runs when the count of new container objects passes 700, so a hook that makes
one object per parameter a step (a list of ``torch.Size``) tips it into most steps of a model
with a few hundred parameters.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import torch_sentinel


def _stack() -> tuple[nn.Module, torch.optim.Optimizer]:
    """500 parameters, initialised so that the gradient keeps its scale through 250 layers (at
    PyTorch's default it underflows, and the norms probe's exact look at each zero norm is
    per-parameter work of its own)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(250) for m in (nn.Linear(8, 8), nn.Tanh())])
    with torch.no_grad():
        for m in model[::2]:
            nn.init.orthogonal_(m.weight, gain=1.05)
            m.bias.zero_()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


@pytest.fixture
def default_thresholds() -> Iterator[None]:
    before, enabled = gc.get_threshold(), gc.isenabled()
    gc.set_threshold(700, 10, 10)  # CPython's defaults, whatever the session set
    gc.enable()
    try:
        yield
    finally:
        gc.set_threshold(*before)
        if not enabled:
            gc.disable()


def _young_collections(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> int:
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    count = [0]

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            count[0] += 1

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    for _ in range(101):  # past the first, densely sampled steps
        step()
    gc.collect()
    gc.callbacks.append(seen)
    try:
        for _ in range(steps):
            step()
    finally:
        gc.callbacks.remove(seen)
    return count[0]


@pytest.mark.slow  # 500 modules, 320 steps: about 12 s
def test_a_many_parameter_model_collects_about_as_often_attached_as_bare(default_thresholds: None) -> None:
    steps = 60
    bare = _young_collections(*_stack(), steps)
    model, opt = _stack()
    sentinel = torch_sentinel.attach(model, opt)
    try:
        attached = _young_collections(model, opt, steps)
    finally:
        sentinel.detach()
    # Measured over these 60 steps: bare 0, attached 17 (a sampled step hooks every module);
    # 68 when the spike ring's storage check made a list of shapes a step.
    assert attached - bare <= steps // 2, (bare, attached)
