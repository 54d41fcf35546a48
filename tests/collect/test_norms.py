"""probes/norms: per-parameter gradient and weight norms, exact where float32 cannot hold them."""

from __future__ import annotations

import statistics

import pytest
import torch
from torch import nn

import torch_sentinel


class _Shrink(nn.Module):
    """Scales the signal by 1e-25: every gradient below it is ~1e-26, nonzero in float32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1e-25


def test_a_tiny_nonzero_gradient_is_not_called_missing() -> None:
    """Regression: squares of gradients below ~1e-23 underflow float32, so their L2 norm read
    exactly 0 and no_gradient claimed (error) that layers 0 and 2 "never received a gradient"
    (seen on a 200-module GELU stack whose first layers get ~1e-31). The norm is now taken
    again exactly on CPU: the gradient is there, vanishing, and is reported as such."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), _Shrink(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    first: list[float] = []
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(8):
            opt.zero_grad()
            model(torch.randn(16, 8, generator=g)).pow(2).mean().backward()
            w = model[0].weight.grad
            assert w is not None and 0 < w.abs().max() < 1e-23 and float(w.norm()) == 0.0
            first.append(float(w.double().norm()))
            opt.step()
        report = s.report()
    assert report.by_kind("no_gradient") == []
    [vanishing] = report.by_kind("vanishing_gradient")
    assert vanishing.module == "0"
    # The median over the steps of layer 0's weight-gradient norm, measured in float64 by hand.
    assert vanishing.evidence["first_norm"] == pytest.approx(statistics.median(first), rel=1e-4)
