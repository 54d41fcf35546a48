"""The majority vote: which ranks hold a tensor that differs from the others (host code).

Every rank runs this on the same gathered numbers, so every rank reaches the same verdict and
takes the same path afterwards (the same bisection collectives, the same raise): no rank waits
in a collective that another skipped.

Input rows are the int64 fingerprints of :mod:`.fingerprint`, gathered as ``(ranks, tensors, 3)``:
``bits``, then ``dot`` (exact mode: an integer; tolerance mode: the float64 bit pattern of the
float projection) and ``sq`` (tolerance mode: float64 bits; exact mode: 0).

- ``exact``: two ranks agree on a tensor when ``bits`` and ``dot`` are the same.
- ``tolerance``: they agree when ``bits`` are the same, or when ``|dot_a - dot_b| <= rtol *
  sqrt(sq)``: a difference of the +-1 projection measured against the tensor's norm (the
  projection itself may be near 0, so it cannot be its own scale). Independent relative noise
  ``e`` per element moves the projection by about ``e * norm``.

The reference is the largest group of agreeing ranks (ties: the group holding the lowest rank);
the ranks outside it have diverged. With two ranks, or an even split, there is no majority, and
the verdict says so.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

__all__ = ["MODES", "Vote", "differing", "pick_piece", "vote"]

MODES = ("exact", "tolerance")


@dataclasses.dataclass(frozen=True)
class Vote:
    """The verdict on one tensor; ranks are indexes into the gathered rows."""

    index: int
    diverged: tuple[int, ...]
    reference: tuple[int, ...]
    #: Whether the reference group holds more than half of the ranks.
    majority: bool
    #: Tolerance mode: the largest ``|dot - dot_ref| / sqrt(sq_ref)`` among diverged ranks.
    deviation: Optional[float] = None


def _floats(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dot, scale) as float64 arrays from int64 rows (..., 3)."""
    dot = np.ascontiguousarray(rows[..., 1]).view(np.float64)
    sq = np.ascontiguousarray(rows[..., 2]).view(np.float64)
    with np.errstate(invalid="ignore"):
        return dot, np.sqrt(sq)


def differing(rows: np.ndarray, mode: str, rtol: float) -> np.ndarray:
    """Indexes of the tensors on which some ranks disagree (vectorised over every tensor)."""
    same_bits = (rows[:, :, 0] == rows[0, :, 0]).all(axis=0)
    if mode == "exact":
        return np.flatnonzero(~(same_bits & (rows[:, :, 1] == rows[0, :, 1]).all(axis=0)))
    dot, scale = _floats(rows)
    with np.errstate(invalid="ignore"):
        spread = dot.max(axis=0) - dot.min(axis=0)
        close = spread <= rtol * scale.min(axis=0)  # NaN anywhere: not close
    return np.flatnonzero(~(same_bits | close))


def _agree(rows: np.ndarray, a: int, b: int, mode: str, rtol: float) -> bool:
    """Whether ranks ``a`` and ``b`` agree on one tensor (rows: (ranks, 3))."""
    if rows[a, 0] == rows[b, 0] and (mode == "tolerance" or rows[a, 1] == rows[b, 1]):
        return True
    if mode == "exact":
        return False
    dot, scale = _floats(rows)
    with np.errstate(invalid="ignore"):
        return bool(abs(dot[a] - dot[b]) <= rtol * min(scale[a], scale[b]))


def vote(rows: np.ndarray, index: int, mode: str, rtol: float) -> Vote:
    """The verdict on tensor ``index`` of gathered ``rows`` (ranks, tensors, 3)."""
    one = rows[:, index, :]
    size = one.shape[0]
    if mode == "exact":
        groups: dict[tuple[int, int], list[int]] = {}
        for r in range(size):
            groups.setdefault((int(one[r, 0]), int(one[r, 1])), []).append(r)
        # Largest group; on a tie, the one holding the lowest rank (dicts keep insertion order).
        reference = max(groups.values(), key=len)
    else:
        dot, _ = _floats(one)
        finite = np.isfinite(dot)
        centre = float(np.median(dot[finite])) if finite.any() else 0.0
        distance = np.where(finite, np.abs(dot - centre), np.inf)
        anchor = int(np.argmin(distance))  # the rank nearest the median: lowest on a tie
        reference = [r for r in range(size) if _agree(one, anchor, r, mode, rtol)]
    diverged = tuple(r for r in range(size) if r not in reference)
    deviation = None
    if mode == "tolerance" and diverged:
        dot, scale = _floats(one)
        ref = reference[0]
        with np.errstate(invalid="ignore", divide="ignore"):
            deviation = float(max(abs(dot[d] - dot[ref]) for d in diverged) / scale[ref])
    return Vote(index, diverged, tuple(reference), 2 * len(reference) > size, deviation)


def pick_piece(rows: np.ndarray, diverged: int, reference: int, mode: str) -> Optional[int]:
    """The piece (of gathered piece fingerprints ``(ranks, pieces, 3)``) where rank ``diverged``
    differs from rank ``reference``: the first that differs (exact), or the one whose projection
    moved most (tolerance); None when none differs."""
    a, b = rows[diverged], rows[reference]
    if mode == "exact":
        differs = np.flatnonzero((a[:, 0] != b[:, 0]) | (a[:, 1] != b[:, 1]))
        return int(differs[0]) if differs.size else None
    dot_a, _ = _floats(a)
    dot_b, _ = _floats(b)
    with np.errstate(invalid="ignore"):
        moved = np.abs(dot_a - dot_b)
    moved = np.where(np.isnan(moved), np.inf, moved)  # a NaN piece is the most moved
    bits_differ = a[:, 0] != b[:, 0]
    if not bits_differ.any() and not (moved > 0).any():
        return None
    return int(np.argmax(np.where(bits_differ | (moved > 0), moved, -1.0)))
