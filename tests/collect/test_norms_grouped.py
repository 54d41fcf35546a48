"""NormsProbe on CPU norms small tensors of one shape (biases, norm-layer weights) as the rows of
one stacked tensor instead of one _foreach_norm entry each: the recorded norms are bit for bit
the ones _foreach_norm gives on the loop's own tensors (no_update compares norms for equality)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import torch_sentinel


@pytest.mark.parametrize("width", [16, 64], ids=["16x16-weights", "64x64-weights-at-the-group-limit"])
def test_grouped_norms_are_bit_identical_to_foreach_norm(width: int) -> None:
    torch.manual_seed(0)
    # 8 biases, 8 LayerNorm weights and biases, 8 square weights (256 or 4,096 elements:
    # grouped too), and a 40-row head alone in its shape.
    model = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(width, width), nn.LayerNorm(width), nn.Tanh())],
                          nn.Linear(width, 40))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sentinel = torch_sentinel.attach(model, opt)
    grads: dict[int, np.ndarray] = {}
    weights: dict[int, np.ndarray] = {}
    for step in range(12):
        opt.zero_grad()
        model(torch.randn(8, width)).pow(2).mean().backward()
        params = list(model.parameters())
        grads[step] = torch.stack(torch._foreach_norm([p.grad for p in params])).numpy().copy()
        weights[step] = torch.stack(torch._foreach_norm([p.detach() for p in params])).numpy().copy()
        opt.step()
    sentinel.flush()
    records = sentinel.recent_records()
    assert [r.step for r in records] == list(range(12))
    for rec in records:
        assert np.array_equal(rec.array("grad_norm"), grads[rec.step]), rec.step
        if rec.meta.weights_recorded:
            assert np.array_equal(rec.array("param_norm"), weights[rec.step]), rec.step
    assert sum(r.meta.weights_recorded for r in records) >= 10
    sentinel.detach()


def test_a_parameter_whose_shape_changes_mid_run_is_still_normed_exactly() -> None:
    """The grouping plan is not re-checked every step; a group that no longer stacks (one of
    its tensors was resized through ``.data``) is planned again, with the same values."""

    class Free(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 2)
            self.vs = nn.ParameterList([nn.Parameter(torch.randn(8)) for _ in range(5)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) * sum(v.pow(2).sum() for v in self.vs)

    torch.manual_seed(0)
    model = Free()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sentinel = torch_sentinel.attach(model, opt)
    grads: dict[int, np.ndarray] = {}
    for step in range(8):
        if step == 4:
            model.vs[0].data = torch.randn(12)
        opt.zero_grad()
        model(torch.randn(4, 3)).sum().backward()
        grads[step] = torch.stack(torch._foreach_norm([p.grad for p in model.parameters()])).numpy().copy()
        opt.step()
    sentinel.flush()
    for rec in sentinel.recent_records():
        assert np.array_equal(rec.array("grad_norm"), grads[rec.step]), rec.step
    assert not [f for f in sentinel.report().findings if f.severity == "error"]
    sentinel.detach()
