"""The spike ring holds, per step and parameter, the exact update and weight norms and the sum of Adam's exp_avg_sq,
row ``step % K``; the units group parameters by module and param group."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from torch_sentinel._collect.spike_ring import RING_STATS, SpikeRing, unit_layout


def _model_and_opt(kind: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    if kind == "adamw":
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return model, torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)


@pytest.mark.parametrize("kind", ["adamw", "sgd"], ids=["adamw", "sgd"])
def test_rows_hold_the_exact_norms_of_their_step(kind: str) -> None:
    model, opt = _model_and_opt(kind)
    params = list(model.parameters())
    ring = SpikeRing(torch.device("cpu"), [opt], params, steps=4)
    x, y = torch.randn(5, 6), torch.randn(5, 3)
    expected = {}
    for step in range(6):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        before = [p.detach().clone() for p in params]
        ring.before_update(opt, step)
        opt.step()
        ring.after_update(opt, step)
        expected[step] = (
            [float((p.detach() - b).norm()) for p, b in zip(params, before)],
            [float(p.detach().norm()) for p in params],
            [float(opt.state[p]["exp_avg_sq"].sum()) if kind == "adamw" else np.nan for p in params],
        )
    values, rows = ring.read()
    held = rows[id(opt)]
    assert sorted(held.tolist()) == [2, 3, 4, 5]  # the last K steps, row step % K
    for step in (2, 3, 4, 5):
        row = values[step % 4]
        for j, name in enumerate(RING_STATS):
            np.testing.assert_allclose(row[j], expected[step][j], rtol=1e-5, err_msg=f"{name} at step {step}")


def test_a_step_without_its_copy_has_no_update_norm() -> None:
    model, opt = _model_and_opt("adamw")
    ring = SpikeRing(torch.device("cpu"), [opt], list(model.parameters()), steps=4)
    x = torch.randn(5, 6)
    for step in range(2):
        opt.zero_grad()
        model(x).sum().backward()
        if step == 0:
            ring.before_update(opt, step)  # step 1's pre-step is missed
        opt.step()
        ring.after_update(opt, step)
    values, _ = ring.read()
    assert np.isfinite(values[0, 0]).all() and np.isnan(values[1, 0]).all()
    assert np.isfinite(values[1, 1]).all()  # the weights are still read


def test_units_split_a_module_only_across_param_groups() -> None:
    layout = unit_layout(
        ["a.weight", "a.bias", "b.weight", "b.bias"], ["a", "a", "b", "b"], ["g0", "g1", "g0", "g0"],
        [4, 2, 4, 2], attention=["attn"], output="b",
    )
    assert layout.units == ("a[g0]", "a[g1]", "b", "attn")
    assert layout.unit_of == (0, 1, 2, 2)
    assert layout.unit_lr == ("g0", "g1", "g0", None)
