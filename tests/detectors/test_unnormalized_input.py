"""unnormalized_input: raw-scale inputs, inputs scaled down twice, and constant features."""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from torch import nn

import torch_sentinel

Batch = Callable[[], torch.Tensor]

CASES: dict[str, tuple[Batch, bool, bool]] = {
    # name: (batch, first layer is BatchNorm, fires)
    "raw_0_255": (lambda: torch.randint(0, 256, (16, 8)).float(), False, True),
    "divided_by_255_twice": (lambda: torch.rand(16, 8) / 255 / 255, False, True),
    "standardized": (lambda: torch.randn(16, 8), False, False),
    "zero_one": (lambda: torch.rand(16, 8), False, False),
    "raw_but_batchnorm_first": (lambda: torch.randint(0, 256, (16, 8)).float(), True, False),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_input_scale(case: str) -> None:
    batch, bn_first, fires = CASES[case]
    torch.manual_seed(0)
    layers = ([nn.BatchNorm1d(8)] if bn_first else []) + [nn.Linear(8, 4), nn.Tanh(), nn.Linear(4, 2)]
    model = nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(5):
            opt.zero_grad()
            model(batch()).pow(2).mean().backward()
            opt.step()
        hits = s.report().by_kind("unnormalized_input")
    assert bool(hits) is fires
    if fires:
        assert hits[0].boundary == "data" and hits[0].evidence["steps_sampled"] == 5


@pytest.mark.parametrize("constant", [[], [2], [0, 7]], ids=["none", "one", "two"])
def test_constant_features(constant: list[int]) -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(6):
            x = torch.randn(16, 8)
            x[:, constant] = 3.0
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
        hits = s.report().by_kind("unnormalized_input")
    assert len(hits) == (1 if constant else 0)
    if constant:
        assert hits[0].evidence["first_constant_features"] == constant


class _MeanOfFeatures(nn.Module):
    """Takes any number of input features: the input's width can change mid-run."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.mean(1, keepdim=True))


def test_a_mask_where_every_feature_varied_is_not_fetched_again_until_a_new_one(monkeypatch) -> None:
    """The constant-feature mask only accumulates: once every feature has varied, the verdict is
    final for it, and the mask is not copied to the host every window. Inputs of another width
    make a new mask, which is checked again (and here holds a constant feature)."""
    from torch_sentinel._collect.inputs import InputStats

    snapshots: list[int] = []
    snapshot = InputStats.snapshot

    def counted(self: InputStats, min_steps: int):  # type: ignore[no-untyped-def]
        snapshots.append(self.mask_generation)
        return snapshot(self, min_steps)

    monkeypatch.setattr(InputStats, "snapshot", counted)
    torch.manual_seed(0)
    model = _MeanOfFeatures()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with torch_sentinel.attach(model, opt, flush_every=2) as s:
        for step in range(80):
            x = torch.randn(16, 8 if step < 40 else 6)
            if step >= 40:
                x[:, 4] = 1.0
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            if step == 39:
                first_mask = list(snapshots)
        hits = s.report().by_kind("unnormalized_input")
    # 20 windows on the first mask: its fetch and the verdict, not a copy every window
    assert 1 <= first_mask.count(1) <= 2
    assert 2 in snapshots
    assert len(hits) == 1 and hits[0].evidence["first_constant_features"] == [4]
