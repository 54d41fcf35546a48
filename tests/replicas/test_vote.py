"""The majority vote and the piece choice, on synthetic gathered rows."""

from __future__ import annotations

import numpy as np
import pytest

from torch_sentinel._replicas.bisect import LIMIT, split
from torch_sentinel._replicas.vote import differing, pick_piece, vote


def rows(*per_rank: tuple[int, float, float]) -> np.ndarray:
    """One tensor: (bits, dot, sq) per rank, as gathered (ranks, 1, 3) int64."""
    out = np.zeros((len(per_rank), 1, 3), dtype=np.int64)
    for r, (bits, dot, sq) in enumerate(per_rank):
        out[r, 0, 0] = bits
        out[r, 0, 1:] = np.array([dot, sq], dtype=np.float64).view(np.int64)
    return out


SAME = (7, 1.5, 4.0)
OTHER = (8, 1.5000001, 4.0)


@pytest.mark.parametrize(
    ("ranks", "diverged", "reference", "majority"),
    [
        ((SAME, OTHER, SAME, SAME), (1,), (0, 2, 3), True),
        ((OTHER, SAME, SAME, SAME), (0,), (1, 2, 3), True),
        ((SAME, OTHER, OTHER, SAME), (1, 2), (0, 3), False),  # 2/2: the group of rank 0
        ((OTHER, SAME), (1,), (0,), False),  # two replicas: either may be wrong
    ],
    ids=["one-of-four", "rank0-diverged", "even-split", "two-ranks"],
)
def test_exact_vote(ranks: tuple, diverged: tuple, reference: tuple, majority: bool) -> None:
    gathered = rows(*ranks)
    assert list(differing(gathered, "exact", 0.0)) == [0]
    v = vote(gathered, 0, "exact", 0.0)
    assert (v.diverged, v.reference, v.majority) == (diverged, reference, majority)


def test_exact_mode_agrees_on_identical_rows_and_on_identical_nans() -> None:
    nan = (3, float("nan"), float("nan"))
    assert differing(rows(SAME, SAME, SAME), "exact", 0.0).size == 0
    assert differing(rows(nan, nan), "exact", 0.0).size == 0


@pytest.mark.parametrize(
    ("dot", "expected"),
    [(1.5 + 1e-6, []), (1.5 + 1e-3, [0])],
    ids=["within-rtol", "beyond-rtol"],
)
def test_tolerance_measures_against_the_norm(dot: float, expected: list) -> None:
    # sqrt(sq) = 2, rtol 1e-5: the allowance is 2e-5, whatever the projection's own size
    gathered = rows(SAME, (9, dot, 4.0), SAME, SAME)
    assert list(differing(gathered, "tolerance", 1e-5)) == expected
    if expected:
        v = vote(gathered, 0, "tolerance", 1e-5)
        assert v.diverged == (1,) and v.majority
        assert v.deviation == pytest.approx(1e-3 / 2)


def test_tolerance_treats_a_nan_on_one_rank_as_a_divergence() -> None:
    gathered = rows(SAME, SAME, (9, float("nan"), 4.0), SAME)
    assert list(differing(gathered, "tolerance", 1e-5)) == [0]
    assert vote(gathered, 0, "tolerance", 1e-5).diverged == (2,)


def test_pick_piece() -> None:
    pieces = np.zeros((2, 4, 3), dtype=np.int64)
    pieces[1, 2, 0] = 5  # rank 1 differs in piece 2 (bits) ...
    pieces[1, 3, 1] = np.array([1e-3]).view(np.int64)[0]  # ... and in piece 3 (projection)
    assert pick_piece(pieces, 1, 0, "exact") == 2
    assert pick_piece(pieces, 1, 0, "tolerance") == 3  # the piece that moved most
    assert pick_piece(pieces, 0, 0, "exact") is None


@pytest.mark.parametrize(("lo", "hi"), [(0, 32768), (0, 130), (100, 229), (5, 6)], ids=str)
def test_split_covers_the_range_in_at_most_64_pieces(lo: int, hi: int) -> None:
    bounds = split(lo, hi)
    assert len(bounds) <= 64 and bounds[0][0] == lo and bounds[-1][1] == hi
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert max(b - a for a, b in bounds) == -(-(hi - lo) // 64)
    assert LIMIT == 128
