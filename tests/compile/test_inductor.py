"""Live under torch.compile with inductor (the default backend), in both orders.

Inductor compiles take tens of seconds on a 2-core CPU, so one small model carries every check
at once: inputs far from unit scale with one constant feature, a dropout left in eval mode, a
ReLU whose units are mostly dead, and a NaN that one layer emits at a known step. Each order
compiles once; one healthy run (one order) shows the same watches stay quiet.
Marked ``inductor``: ``-m "not inductor"`` skips them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from helpers import Scale
from torch import nn
from torch._dynamo.utils import counters
from userscript import events

import torch_sentinel
from torch_sentinel import NonFiniteError

pytestmark = pytest.mark.inductor

NAN_STEP = 11
CONSTANT_FEATURE = 3


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.relu = nn.ReLU()
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(32, 32)
        self.scale = Scale()
        self.head = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.scale(self.fc2(self.drop(self.relu(self.fc1(x))))))


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("order", ["attach-then-compile", "compile-then-attach"], ids=["attach-first", "compile-first"])
def test_detectors_are_live_under_inductor_and_a_nan_is_blamed_on_its_layer(
    order: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    resets: list[int] = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1))
    torch.manual_seed(0)
    model = Net()
    with torch.no_grad():
        model.fc1.bias.fill_(-1e4)  # most ReLU units never fire, even for inputs of scale 100
        model.fc1.bias[:4] = 0.0
    model.drop.eval()  # left in eval mode while training
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    # dead_relu reports after 5 sampled steps here (20 by default), before the NaN at step 11
    options = dict(check="deferred", flush_every=5, thresholds={"dead_relu.min_steps": 5})
    if order == "attach-then-compile":
        s = torch_sentinel.attach(model, opt, **options)
        compiled = torch.compile(model)
    else:
        compiled = torch.compile(model)
        s = torch_sentinel.attach(model, opt, **options)
    g = torch.Generator().manual_seed(0)
    err = None
    graphs_after_warmup = None
    try:
        for step in range(NAN_STEP + 3):
            if step == 2:
                graphs_after_warmup = dict(counters["stats"])
            if step == NAN_STEP:
                model.scale.factor.fill_(math.nan)  # 'scale' turns finite inputs into NaN
            x = torch.randn(16, 8, generator=g) * 50 + 20  # far from zero mean / unit scale
            x[:, CONSTANT_FEATURE] = 7.0  # a filled column: constant in every batch
            opt.zero_grad()
            compiled(x).pow(2).mean().backward()
            opt.step()
        s.detach()
    except NonFiniteError as e:
        err = e
    finally:
        s.detach()
    assert err is not None
    assert (err.step, err.boundary, err.module) == (NAN_STEP, "forward", "scale")
    found = s.report().findings
    kinds = {f.kind for f in found}
    assert {"dead_relu", "unnormalized_input", "eval_mode_training"} <= kinds, found
    # the scale and the constant-feature mask, both measured under compile, in one finding
    (inputs,) = [f for f in found if f.kind == "unnormalized_input"]
    assert inputs.severity == "warning" and inputs.evidence["std"] > 10, inputs
    assert inputs.evidence["first_constant_features"] == [CONSTANT_FEATURE], inputs
    assert [f.module for f in found if f.kind == "eval_mode_training"] == ["drop"]
    relu = [f for f in found if f.kind == "dead_relu"]
    # nn.ReLU is watched under compile: the reduction is traced, the mask kept outside the graph
    assert [(f.severity, f.module) for f in relu] == [("warning", "relu")], relu
    assert relu[0].evidence["dead_units"] == 28 and relu[0].step < NAN_STEP
    assert dict(counters["graph_break"]) == {}
    assert dict(counters["stats"]) == graphs_after_warmup  # no recompiles across steps
    assert resets == []


class Healthy(nn.Module):
    """ReLUs as modules and as a function, standardized inputs: nothing to report."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(x)))


def test_healthy_model_is_quiet_under_inductor(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Healthy()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    s = torch_sentinel.attach(model, opt, check="deferred", flush_every=5, log_dir=tmp_path,
                              thresholds={"dead_relu.min_steps": 5})
    compiled = torch.compile(model)
    g = torch.Generator().manual_seed(0)
    with s:
        for step in range(12):
            if step == 2:
                graphs_after_warmup = dict(counters["stats"])
            x = torch.randn(16, 8, generator=g)
            opt.zero_grad()
            compiled(x).pow(2).mean().backward()
            opt.step()
    found = s.report().findings
    assert found == [], found
    # the watch ran under compile: the ReLU's dead fraction was measured (and is low)
    dead = [e.value for e in events(tmp_path).Scalars("dead_fraction/relu")]
    assert dead and max(dead) < 0.5, dead
    assert dict(counters["graph_break"]) == {}
    assert dict(counters["stats"]) == graphs_after_warmup
