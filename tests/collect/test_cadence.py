"""The sampling schedule shared by the probes that sample (cadence.py)."""

from __future__ import annotations

import pytest

from torch_sentinel._collect.cadence import WIDE, WIDEN_AT, sampled


def test_the_first_steps_then_every_tenth_then_every_fiftieth() -> None:
    steps = [s for s in range(400) if sampled(s)]
    assert steps[:10] == list(range(10))
    assert [s for s in steps if 10 <= s < WIDEN_AT] == list(range(10, WIDEN_AT, 10))
    assert [s for s in steps if s >= WIDEN_AT] == list(range(WIDEN_AT, 400, WIDE))


@pytest.mark.parametrize(("first", "every"), [(5, 10), (10, 10), (3, 7)], ids=["5-10", "10-10", "3-7"])
def test_a_probes_own_first_and_every_are_kept_before_the_widening(first: int, every: int) -> None:
    assert [s for s in range(WIDEN_AT) if sampled(s, first, every)] == (
        list(range(first)) + [s for s in range(first, WIDEN_AT) if s % every == 0])
