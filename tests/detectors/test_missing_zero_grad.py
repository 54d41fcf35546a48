"""missing_zero_grad: gradients carried across steps; accumulation within a step is healthy."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torch_sentinel

CASES = {
    "never_zeroed": (None, 1, True),
    "set_to_none_false": (False, 1, False),
    "accumulate_4_microbatches": (True, 4, False),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_stale_gradients(case: str) -> None:
    set_to_none, micro, fires = CASES[case]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(8):
            if set_to_none is not None:
                opt.zero_grad(set_to_none=set_to_none)
            for _ in range(micro):
                (model(torch.randn(8, 4)).pow(2).mean() / micro).backward()
            opt.step()
        hits = s.report().by_kind("missing_zero_grad")
    assert bool(hits) is fires
    if fires:
        ev = hits[0].evidence
        assert ev["steps"] == [1, 2, 3] and all(v > 0 for v in ev["stale_grad_norm"])
