"""Narrow a differing tensor down to a range of at most 128 elements, with chunk checksums.

Each round splits the range in up to 64 pieces, fingerprints each piece on every rank, gathers
them (one collective) and keeps the piece where the diverged rank differs from the reference:
a 16M-element tensor takes 3 rounds. Every rank computes the same split from the same numbers
and picks the same piece from the same gathered data, so all ranks run the same rounds.
Only the differing tensor is read: cold path, at a check that found a divergence.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from .exchange import gather_rows
from .fingerprint import Marker, flat
from .plan import ReplicaGroup
from .vote import pick_piece

__all__ = ["LIMIT", "PIECES", "narrow", "split"]

#: The range the bisection stops at (the issue's bound on a reported chunk).
LIMIT = 128
#: Pieces per round.
PIECES = 64


def split(lo: int, hi: int, pieces: int = PIECES) -> list[tuple[int, int]]:
    """``[lo, hi)`` cut into at most ``pieces`` consecutive ranges of (nearly) equal size."""
    step = max(1, -(-(hi - lo) // pieces))
    return [(s, min(s + step, hi)) for s in range(lo, hi, step)]


def narrow(marker: Marker, tensor: torch.Tensor, group: ReplicaGroup, diverged: int, reference: int,
           mode: str) -> tuple[Optional[tuple[int, int]], int]:
    """``([start, end), numel)``: a range of the flattened local ``tensor`` of at most
    :data:`LIMIT` elements where group rank ``diverged`` differs from group rank ``reference``;
    the range is None when a rank failed to compute its pieces (logged there)."""
    values = flat(tensor)
    lo, hi = 0, values.numel()
    while hi - lo > LIMIT:
        bounds = split(lo, hi)
        compute = functools.partial(marker.piece_rows, values, bounds, group.device)
        got = gather_rows(compute, (len(bounds), 3), group.group, group.size, group.device,
                          "chunk checksums")
        if got.failed:
            return None, values.numel()
        piece = pick_piece(got.rows, diverged, reference, mode)
        if piece is None:
            break  # the difference is spread below what one piece shows (tolerance mode)
        lo, hi = bounds[piece]
    return (lo, hi), values.numel()
