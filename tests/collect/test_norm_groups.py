"""The CPU helpers that reduce many small tensors of one shape as the rows of one stack: the
figures must be the ones a per-tensor ``_foreach_norm`` gives, bit for bit."""

from __future__ import annotations

import pytest
import torch

from torch_sentinel._collect.norm_groups import GroupedCopy, GroupPlan, grouped_norms


def _tensors() -> list[torch.Tensor]:
    torch.manual_seed(0)
    # Eight 64x64 (grouped), nine biases of 64 (grouped), three of a shape seen three times (too
    # few to stack), one over the group limit, a 0-d one.
    shapes = [(64, 64)] * 8 + [(64,)] * 9 + [(3, 7)] * 3 + [(80, 80), ()]
    return [torch.randn(s) * 10.0 ** (i % 5 - 2) for i, s in enumerate(shapes)]


def _per_tensor(tensors: list[torch.Tensor], ord: float) -> torch.Tensor:
    return torch.stack(torch._foreach_norm(tensors, ord))


@pytest.mark.parametrize("ord", [2.0, 1.0], ids=["l2", "l1"])
def test_grouped_norms_match_per_tensor_norms(ord: float) -> None:
    tensors = _tensors()
    plans: dict = {}
    dest = torch.full((len(tensors),), float("nan"))
    grouped_norms(plans, "k", tensors, dest, ord)
    assert torch.equal(dest, _per_tensor(tensors, ord))
    assert len(plans["k"].groups) == 2 and len(plans["k"].big) == 5


def test_a_group_that_no_longer_stacks_is_planned_again() -> None:
    tensors = _tensors()
    plans: dict = {}
    dest = torch.empty(len(tensors))
    grouped_norms(plans, "k", tensors, dest)
    first = plans["k"]
    tensors[9] = torch.randn(65)  # one bias resized: its group no longer stacks
    grouped_norms(plans, "k", tensors, dest)
    assert plans["k"] is not first
    assert torch.equal(dest, _per_tensor(tensors, 2.0))


def test_grouped_copy_measures_the_change_of_each_tensor() -> None:
    tensors = _tensors()
    copy = GroupedCopy(tensors)
    for step in range(3):
        before = [t.clone() for t in tensors]
        copy.copy(tensors)
        for i, t in enumerate(tensors):
            t.add_(torch.randn_like(t) * (i + step))
        dest = torch.empty(len(tensors))
        copy.changed(tensors, dest)
        expected = _per_tensor([b - t for b, t in zip(before, tensors)], 2.0)
        assert torch.equal(dest, expected), step
    assert isinstance(copy.plan, GroupPlan)


def test_sums_of_non_negative_tensors_are_their_l1_norms() -> None:
    """``"sum"`` (the spike ring's ``exp_avg_sq``): a plain sum for the stacked rows, the same
    figure as the L1 norm up to rounding (the order of the additions differs)."""
    tensors = [t.abs() for t in _tensors()]
    plans: dict = {}
    dest = torch.full((len(tensors),), float("nan"))
    grouped_norms(plans, "k", tensors, dest, "sum")
    torch.testing.assert_close(dest, _per_tensor(tensors, 1.0), rtol=1e-6, atol=0.0)
    assert torch.equal(dest[:8], torch.stack([t.sum() for t in tensors[:8]]))  # a stacked group: its rows' sums


def test_grouped_copy_hands_back_the_stacks_of_whole_groups_for_their_norms() -> None:
    """The spike ring's post-step: the stack ``changed`` makes of a group of whole weights serves
    their weight norms too, with the same figures, bit for bit, as stacking them again."""
    tensors = _tensors()
    whole = [i >= 8 for i in range(len(tensors))]  # the 64x64 group stands for samples: not whole
    copy = GroupedCopy(tensors, whole)
    copy.copy(tensors)
    for t in tensors:
        t.add_(0.5)
    stacked = copy.changed(tensors, torch.empty(len(tensors)))
    biases = tuple(range(8, 17))
    assert list(stacked) == [biases]
    assert torch.equal(stacked[biases], torch.stack(tensors[8:17]))

    plans: dict = {}
    shared, fresh = torch.empty(len(tensors)), torch.empty(len(tensors))
    grouped_norms(plans, "k", tensors, shared, 2.0, stacked)
    grouped_norms(plans, "k", tensors, fresh, 2.0)
    assert torch.equal(shared, fresh) and torch.equal(shared, _per_tensor(tensors, 2.0))


def test_a_grouped_copy_without_whole_flags_hands_back_nothing() -> None:
    copy = GroupedCopy(_tensors())
    assert copy.changed(_tensors(), torch.empty(22)) == {}
