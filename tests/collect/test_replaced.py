"""A submodule replaced after attach() (``model.head = nn.Linear(...)``) is watched again at the
model's next forward, under the same name, with one warning saying what is not watched."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from helpers import MLP, make_batch
from torch import nn

import torch_sentinel
from torch_sentinel import NonFiniteError


class _Head(nn.Linear):
    """The replacement head; ``poison`` makes its output NaN (a forward fault of its own)."""

    poison = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out * math.nan if self.poison else out


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, *, replace_at: int, nan_at: int) -> None:
    g = torch.Generator().manual_seed(0)
    for step in range(steps):
        if step == replace_at:
            torch.manual_seed(1)
            model.head = _Head(32, 4)  # type: ignore[assignment]
            opt.add_param_group({"params": list(model.head.parameters())})
        if step == nan_at:
            model.head.poison = True  # type: ignore[assignment]
        x, y = make_batch("mlp", generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


@pytest.mark.parametrize("check", ["immediate", "deferred"])
def test_a_nan_in_a_head_replaced_after_attach_is_localised_to_it(check: str, caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sentinel = torch_sentinel.attach(model, opt, check=check)
    try:
        with caplog.at_level(logging.WARNING, logger="torch_sentinel"), pytest.raises(NonFiniteError) as info:
            _train(model, opt, 12, replace_at=3, nan_at=6)
    finally:
        sentinel.detach(quiet=True)
    assert (info.value.module, info.value.step, info.value.boundary) == ("head", 6, "forward")
    replaced = [r.getMessage() for r in caplog.records if "was replaced after attach" in r.getMessage()]
    assert len(replaced) == 1 and "'head' (_Head)" in replaced[0] and "from step 3" in replaced[0]


def test_a_replaced_head_trains_quietly_and_bit_identically() -> None:
    """Re-instrumenting changes nothing the model computes, and raises no false alarm."""
    weights = []
    for attached in (False, True):
        torch.manual_seed(0)
        model = MLP()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sentinel = torch_sentinel.attach(model, opt) if attached else None
        _train(model, opt, 12, replace_at=3, nan_at=-1)
        weights.append([p.detach().clone() for p in model.parameters()])
        if sentinel is not None:
            assert sentinel.report(all_ranks=False).findings == []
            sentinel.detach()
            # detach() removed the hooks put on the new head as well.
            assert not model.head._forward_hooks and not model.head._forward_pre_hooks
    assert all(torch.equal(a, b) for a, b in zip(*weights))
