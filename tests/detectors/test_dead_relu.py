"""dead_relu: units that never fire, for every way of spelling a ReLU, named by the module that
applied it; sparse-but-alive layers stay quiet."""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import torch_sentinel

# Looked up at call time, as ``torch.relu(x)`` written in a forward is. (A reference to the C
# builtin captured before attach, ``act = torch.relu`` at import, bypasses the patch.)
SPELLINGS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "F.relu": F.relu,
    "F.relu_inplace": lambda t: F.relu(t, inplace=True),
    "torch.relu": lambda t: torch.relu(t),
    "torch.relu_": lambda t: torch.relu_(t),
    "Tensor.relu": lambda t: t.relu(),
    "Tensor.relu_": lambda t: t.relu_(),
}


class Block(nn.Module):
    def __init__(self, act: Callable[[torch.Tensor], torch.Tensor], dead: int, units: int = 16) -> None:
        super().__init__()
        self.fc = nn.Linear(8, units)
        self.act = act
        with torch.no_grad():
            self.fc.bias[:dead] = -50.0  # these units can never fire

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class Net(nn.Module):
    def __init__(self, act: Callable[[torch.Tensor], torch.Tensor], dead: int = 16) -> None:
        super().__init__()
        self.block = Block(act, dead)
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x))


def _train(model: nn.Module, steps: int = 22, **kwargs) -> torch_sentinel.Report:
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with torch_sentinel.attach(model, opt, **kwargs) as s:
        for _ in range(steps):
            x = torch.randn(16, *model.input_shape) if hasattr(model, "input_shape") else torch.randn(16, 8)
            opt.zero_grad()
            model(x).float().pow(2).mean().backward()
            opt.step()
        return s.report()


@pytest.mark.parametrize("spelling", list(SPELLINGS), ids=list(SPELLINGS))
def test_functional_relu_is_attributed_to_the_module_that_applied_it(spelling: str) -> None:
    report = _train(Net(SPELLINGS[spelling]))
    hits = report.by_kind("dead_relu")
    assert [f.module for f in hits] == ["block"]
    ev = hits[0].evidence
    assert ev["dead_fraction"] == 1.0 and ev["units"] == 16 and ev["unit_axis"] == "features"
    assert ev["steps_observed"] >= 10
    assert report.boundary == "forward"
    # the call site, not only the module (issue 12): this test file, the line of the call
    assert ev["call_site"] and ev["call_site"].startswith(__file__.rsplit(".", 1)[0]) and " at " in hits[0].message


def test_relu_module_is_named_by_its_own_name() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    with torch.no_grad():
        model[0].bias.fill_(-50.0)
    hits = _train(model).by_kind("dead_relu")
    assert [f.module for f in hits] == ["1"]


def test_conv_units_are_channels() -> None:
    model = nn.Sequential(nn.Conv2d(3, 6, 3), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 4 * 4, 2))
    model.input_shape = (3, 6, 6)
    with torch.no_grad():
        model[0].bias[:5] = -50.0
    hits = _train(model).by_kind("dead_relu")
    assert len(hits) == 1
    assert hits[0].evidence["unit_axis"] == "channels" and hits[0].evidence["units"] == 6
    assert hits[0].evidence["dead_units"] == 5 and hits[0].evidence["first_dead_units"] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(("threshold", "fires"), [(None, False), (0.4, True)], ids=["default_0.7", "custom_0.4"])
def test_threshold_is_configurable(threshold: float, fires: bool) -> None:
    thresholds = {} if threshold is None else {"dead_relu.fraction": threshold}
    report = _train(Net(F.relu, dead=8), thresholds=thresholds)  # half the units dead
    assert bool(report.by_kind("dead_relu")) is fires
    if fires:
        assert report.by_kind("dead_relu")[0].evidence["dead_fraction"] == 0.5


def test_rarely_firing_units_are_alive() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    with torch.no_grad():
        # pre-activations have std ~0.6: at a bias of -1 each unit fires on a few percent of
        # samples (at -2 it is 1 in 5000, which is dead for every practical purpose)
        model[0].bias.fill_(-1.0)
    report = _train(model, steps=40)
    assert report.by_kind("dead_relu") == []


def test_relu_outside_the_model_and_in_eval_is_ignored() -> None:
    model = Net(F.relu, dead=16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(12):
            opt.zero_grad()
            torch.relu(model(torch.randn(4, 8))).sum().backward()  # a ReLU in the loop
            opt.step()
        watch = next(d for d in s._detectors if d.kind == "dead_relu").watch
        assert {site.module for site in watch.sites.values()} == {"block"}


def test_patches_are_restored_exactly_at_detach() -> None:
    before = (torch.relu, torch.relu_, F.relu, F.relu_)
    assert "relu" not in torch.Tensor.__dict__
    model = Net(F.relu)
    s = torch_sentinel.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert torch.relu is not before[0] and "relu" in torch.Tensor.__dict__
    s.detach()
    assert (torch.relu, torch.relu_, F.relu, F.relu_) == before
    assert "relu" not in torch.Tensor.__dict__ and "relu_" not in torch.Tensor.__dict__


class _KillAt(nn.Module):
    """Linear(8, 16) + ReLU whose units all die at ``step`` (the loop sets ``dead``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.head = nn.Linear(16, 2)
        self.dead = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return self.head(self.act(h - 100.0 if self.dead else h))


def _run_kill(kill_at: int, steps: int, **kwargs) -> tuple[torch_sentinel.Report, int]:
    torch.manual_seed(0)
    model = _KillAt()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with torch_sentinel.attach(model, opt, **kwargs) as s:
        detector = next(d for d in s._detectors if d.kind == "dead_relu")
        reductions = 0
        reduce = detector.watch._reduce

        def counting(*args, **kw):  # counts the per-unit reductions the watch takes
            nonlocal reductions
            reductions += 1
            return reduce(*args, **kw)

        detector.watch._reduce = counting
        for step in range(steps):
            model.dead = step >= kill_at
            opt.zero_grad()
            model(torch.randn(16, 8)).pow(2).mean().backward()
            opt.step()
        return s.report(), reductions


@pytest.mark.parametrize(
    "every, expected", [(None, 100 + 100 // 4), (1, 200)], ids=["default-one-in-4-past-100", "every-step"]
)
def test_past_step_100_one_step_in_every_is_sampled(every: int, expected: int) -> None:
    thresholds = {} if every is None else {"dead_relu.every": every}
    _, reductions = _run_kill(kill_at=10**6, steps=200, thresholds=thresholds)
    assert reductions == expected


def test_a_layer_dying_after_step_100_is_still_reported_from_sampled_batches() -> None:
    """The window counts sampled batches: 20 of them, one step in 4, then the detector's turn."""
    report, _ = _run_kill(kill_at=150, steps=150 + 4 * 20 + 30)
    [finding] = report.by_kind("dead_relu")
    assert finding.module == "act"
    assert finding.evidence["dead_fraction"] == 1.0
    assert 150 + 4 * 20 <= finding.step <= 150 + 4 * 20 + 30
