"""The spike ring holds, per step and parameter, the update and weight norms and the sum of Adam's exp_avg_sq,
row ``step % K`` (exact for parameters up to ``WHOLE`` elements; larger ones have their update and exp_avg_sq
measured on a fixed sample, their weight norm whole); the units group parameters by module and param group."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from torch_sentinel._collect.spike_ring import (
    BLOCK,
    RING_STATS,
    SAMPLE,
    WHOLE,
    SpikeRing,
    sample_of,
    unit_layout,
)


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


def _big_model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(1000, 64), nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 1000))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))


def _lm_step(model: nn.Module, opt: torch.optim.Optimizer, ring: SpikeRing, step: int) -> None:
    ids = torch.randint(0, 1000, (8, 16))
    opt.zero_grad()
    nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
    ring.before_update(opt, step)
    opt.step()
    ring.after_update(opt, step)


def test_large_parameters_are_sampled_and_scaled_to_their_whole_size() -> None:
    model, opt = _big_model()
    params = list(model.parameters())
    assert [sample_of(p) is not p for p in params] == [True, True, False, True, False]
    ring = SpikeRing(torch.device("cpu"), [opt], params, steps=4)
    for step in range(5):
        before = [p.detach().clone() for p in params]
        _lm_step(model, opt, ring, step)
    update = np.array([float((p.detach() - b).norm()) for p, b in zip(params, before)])
    weight = np.array([float(p.detach().norm()) for p in params])
    second = np.array([float(opt.state[p]["exp_avg_sq"].sum()) for p in params])
    values, _ = ring.read()
    row = values[4 % 4]
    np.testing.assert_allclose(row[1], weight, rtol=1e-5)  # every element, always
    # A sample of SAMPLE elements: within 5% (update) and 10% (exp_avg_sq) on the dense weights.
    # An embedding's update and second moment live in the rows its batches touched, and its 128
    # blocks see 1 row in 8: within 20%.
    np.testing.assert_allclose(row[0][1:], update[1:], rtol=0.05)
    np.testing.assert_allclose(row[2][1:], second[1:], rtol=0.1)
    np.testing.assert_allclose(row[[0, 2], 0], [update[0], second[0]], rtol=0.2)
    small = [i for i, p in enumerate(params) if p.numel() <= WHOLE]
    np.testing.assert_allclose(row[0][small], update[small], rtol=1e-5)  # small ones whole, exact


def test_one_corrupted_element_shows_in_the_weight_norm_but_not_the_update() -> None:
    """The corruption rule compares the two: the weight norm must see every element."""
    model, opt = _big_model()
    params = list(model.parameters())
    ring = SpikeRing(torch.device("cpu"), [opt], params, steps=4)
    _lm_step(model, opt, ring, 0)
    assert sample_of(params[3]).stride(0) > BLOCK  # the second block is not in the sample
    with torch.no_grad():
        params[3].view(-1)[BLOCK + 3] *= 2.0**40
    _lm_step(model, opt, ring, 1)
    values, _ = ring.read()
    assert values[1, 1, 3] > 1e6 * values[0, 1, 3]
    assert values[1, 0, 3] < 10 * values[0, 0, 3]


def test_a_swapped_parameter_storage_is_measured_where_it_now_lives() -> None:
    model, opt = _big_model()
    params = list(model.parameters())
    ring = SpikeRing(torch.device("cpu"), [opt], params, steps=4)
    _lm_step(model, opt, ring, 0)
    with torch.no_grad():
        params[1].data = params[1].data.clone()  # e.g. a wrapper that re-materialises weights
    before = params[1].detach().clone()
    _lm_step(model, opt, ring, 1)
    values, _ = ring.read()
    exact = float((params[1].detach() - before).norm())
    assert values[1, 0, 1] == pytest.approx(exact, rel=0.05)


@pytest.mark.parametrize("grouped", [True, False], ids=["cpu-grouped", "per-tensor"])
@pytest.mark.parametrize("which", ["one", "all"], ids=["one-bias", "every-bias"])
def test_a_parameter_reshaped_in_place_keeps_its_exact_update_norm(grouped: bool, which: str, monkeypatch) -> None:
    """A bias given another shape of the same size through ``.data`` (same storage, same element
    count: the per-step check looks at counts and addresses only) is still measured exactly;
    the copy of the samples is made again where it no longer fits."""
    from torch_sentinel._collect import norm_groups

    if not grouped:
        monkeypatch.setattr(norm_groups.batch, "FUSED_ON_CPU", True)  # the accelerator path, on CPU
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(10)])  # ten biases of 4: a stacked group on CPU
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    params = list(model.parameters())
    ring = SpikeRing(torch.device("cpu"), [opt], params, steps=4)
    assert all(p.grouping == grouped for p in ring.plans.values())
    for step in range(3):
        if step == 1:
            for p in params[1::2] if which == "all" else [params[3]]:
                p.data = p.data.view(1, 4)
        opt.zero_grad()
        model(torch.randn(2, 4)).pow(2).mean().backward()
        before = [p.detach().clone() for p in params]
        ring.before_update(opt, step)
        opt.step()
        ring.after_update(opt, step)
        values, _ = ring.read()
        exact = [float((p.detach() - b).norm()) for p, b in zip(params, before)]
        np.testing.assert_allclose(values[step, 0], exact, rtol=1e-5)


def test_parameters_up_to_whole_elements_are_measured_whole() -> None:
    square = torch.empty(64, 64)
    assert sample_of(square) is square  # WHOLE elements: every element
    transposed = square.t()[:, :63]
    assert sample_of(transposed) is transposed  # no flat view: whole


@pytest.mark.parametrize("numel", [WHOLE + 1, 65_536, 1_000_003], ids=["just-above-whole", "64k", "1m-odd"])
def test_larger_parameters_are_sampled_as_one_shape_of_whole_cache_lines(numel: int) -> None:
    """Every sample is ``SAMPLE // BLOCK`` blocks of ``BLOCK`` consecutive elements, every
    ``s``-th block from the first, ``s`` odd and as large as still fits: one shape for every
    large parameter (so they stack), spread over as much of the tensor as it allows."""
    t = torch.arange(numel, dtype=torch.float32)
    sample = sample_of(t)
    count = SAMPLE // BLOCK
    stride = sample.stride(0) // BLOCK
    assert sample.shape == (count, BLOCK) and sample.stride(1) == 1  # a block is consecutive elements,
    assert sample.stride(0) % BLOCK == 0 and stride % 2 == 1  # starts on a block boundary, every odd block
    assert (count - 1) * stride * BLOCK + BLOCK <= numel  # inside the tensor,
    assert (count - 1) * (stride + 2) * BLOCK + BLOCK > numel  # the next odd stride would not be
    assert torch.equal(sample[-1], t[(count - 1) * stride * BLOCK:][:BLOCK])
    assert sample.data_ptr() == t.data_ptr()  # a view: no copy


def test_a_group_of_whole_weights_is_stacked_once_a_post_step_for_both_norms(monkeypatch) -> None:
    """On CPU, twelve 16x16 weights (and their biases) are copied, subtracted and normed as the
    rows of one stack; the post-step's stack of their current values serves the weight norms too:
    one stack fewer a group, and the same exact figures."""
    from torch_sentinel._collect import norm_groups
    from torch_sentinel.testing import count_launches

    def run() -> tuple[np.ndarray, list[list[float]], int]:
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(12)])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        params = list(model.parameters())
        ring = SpikeRing(torch.device("cpu"), [opt], params, steps=4)
        exact, stacks = [], 0
        for step in range(3):
            opt.zero_grad()
            model(torch.randn(4, 16)).pow(2).mean().backward()
            before = [p.detach().clone() for p in params]
            ring.before_update(opt, step)
            opt.step()
            with count_launches() as launches:
                ring.after_update(opt, step)
            stacks = launches.ops.get("stack", 0)
            exact.append([float((p.detach() - b).norm()) for p, b in zip(params, before)])
        return ring.read()[0], exact, stacks

    values, exact, shared_stacks = run()
    changed = norm_groups.GroupedCopy.changed

    def changed_sharing_nothing(self: norm_groups.GroupedCopy, *args: object) -> norm_groups.Stacks:
        changed(self, *args)  # type: ignore[arg-type]
        return {}

    monkeypatch.setattr(norm_groups.GroupedCopy, "changed", changed_sharing_nothing)
    unshared, _, stacks = run()
    assert shared_stacks == stacks - 2  # the weights' group and the biases'
    assert np.array_equal(values[:3], unshared[:3], equal_nan=True)
    for step in range(3):
        np.testing.assert_allclose(values[step, 0], exact[step], rtol=1e-5)
