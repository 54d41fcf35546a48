"""update_ratio: ||dW|| / ||W|| far above ~1e-3 on the sampled steps."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torch_sentinel


@pytest.mark.parametrize(("lr", "fires"), [(1e-3, False), (1.0, True)], ids=["adam_1e-3", "adam_1.0"])
def test_update_ratio(lr: float, fires: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    with torch_sentinel.attach(model, opt, update_every=2) as s:
        for _ in range(8):
            x = torch.randn(16, 16)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
            opt.step()
        hits = s.report().by_kind("update_ratio")
    assert bool(hits) is fires
    if fires:
        ev = hits[0].evidence
        assert ev["ratio"] > 0.1 and ev["steps"] == [0, 2, 4] and ev["largest_param"].endswith("weight")
