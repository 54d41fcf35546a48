"""Fingerprints of tensors, computed on the tensors' own device: no host copy of the values.

A fingerprint is three numbers, kept as one int64 row so that one collective carries any number
of them. Everything starts from the tensor's bit pattern read as integer words (float32 as
int32; pairs of bf16/fp16 values as int32 when they align, else int16; float64 as int64), viewed
as rows of :data:`ROW` words, and **one pass** over it: the column sums (``sum(dim=0)``, read
only, no temporary the size of the tensor). The words are summed in their own width (a wider
accumulator would make torch convert every word first), so every sum wraps: modular addition
does not depend on the order of the terms, so every rank, every thread count and every kind of
device gets the same sums for the same bits. From the ``ROW`` column sums (and the words of the
last partial row):

- ``bits``: the sum of every word. Any single flipped bit changes it (by +-2^k, never 0 modulo
  the word width).
- ``dot`` (exact mode): the sum of the words weighted by a seeded +-1 vector of ``ROW`` elements,
  repeated along the tensor (weighting the column sums is the same). It catches half of what
  ``bits`` cancels (two flips of the same bit in opposite directions, where the two positions
  got opposite signs).

Tolerance mode compares values, not bits, so there ``dot`` is the float dot product of the
values with the same +-1 vector (its float64 bits, as int64): each row summed by one thread in a
fixed order in float32 (float64 for float64 tensors), the row sums in float64, in a fixed order
too, so the same bits give the same float on the same kind of device whatever the thread count,
with no BLAS call (whose order follows the thread count) and no float64 copy of the tensor. And
``sq``, the float64 sum of squares, from one ``_foreach_norm`` over every tensor: the scale
against which a difference of ``dot`` is measured. Exact mode sends 0 there.

Per tensor in exact mode: the column sums, and 2 kernels over ``ROW`` elements (1 more when the
size is not a multiple of ``ROW``); then one stack and one conversion for all tensors at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import torch

from .._collect.shards import local

__all__ = ["ROW", "SEED", "Marker", "flat", "word_sum"]

#: Seed of the +-1 vector: the same on every rank, so no rank has to send it.
SEED = 0x5E171E1

#: Elements per row of the projection: a row and its products stay in a CPU's L1/L2 cache, and
#: one thread sums it; accelerators reduce many such rows in one kernel.
ROW = 4096
#: Below this many elements torch sums a vector on one CPU thread (``at::internal::GRAIN_SIZE``):
#: the row sums are added in pieces of this size, so their order does not follow the thread count.
_SERIAL = 32768

_WORDS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def flat(t: torch.Tensor) -> torch.Tensor:
    """The local values of ``t`` as one contiguous 1-D real tensor (a view when possible)."""
    t = local(t).detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.reshape(-1)


def _words(values: torch.Tensor) -> torch.Tensor:
    """``values`` viewed as integer words (16-bit pairs as int32 where they align)."""
    size = values.element_size()
    words_dtype = _WORDS[size]
    if size < 4 and (values.numel() * size) % 4 == 0 and (values.storage_offset() * size) % 4 == 0:
        words_dtype = torch.int32  # pairs of 16-bit values: a wider word, fewer collisions
    if values.dtype == torch.bool:
        values = values.view(torch.int8)
    return values.view(words_dtype)


def _word_sum(values: torch.Tensor) -> torch.Tensor:
    """The wrapping sum of the bit pattern of a 1-D tensor, in the words' own width."""
    words = _words(values)
    return words.sum(dtype=words.dtype)


def word_sum(values: torch.Tensor) -> torch.Tensor:
    """The wrapping sum of the bit pattern of a 1-D tensor, as an int64 0-d tensor (device op)."""
    return _word_sum(values).to(torch.int64)


def _ordered_sum(parts: torch.Tensor) -> torch.Tensor:
    """The float64 sum of a 1-D tensor, added in the same order whatever the thread count."""
    while parts.numel() > _SERIAL:
        rows = parts.numel() // _SERIAL
        head = parts[: rows * _SERIAL].view(rows, _SERIAL).sum(dim=1, dtype=torch.float64)
        parts = torch.cat([head, parts[rows * _SERIAL:].to(torch.float64)])
    return parts.sum(dtype=torch.float64)


class _Layout:
    """Where each tensor's parts sit in one batch: its row of column sums (if it has ``ROW``
    words or more) and its rest (the last partial row, or the whole small tensor)."""

    def __init__(self, shape: Sequence[tuple[bool, int]], signs: torch.Tensor, device: torch.device,
                 dtype: torch.dtype) -> None:
        columns = sum(1 for has, _ in shape if has)
        rests = [n for has, n in shape if n or not has]
        zero = columns + len(rests)  # the zero row of the table
        column_of, rest_of, c, r = [], [], 0, 0
        for has, n in shape:
            column_of.append(c if has else zero)
            c += has
            rest_of.append(columns + r if n or not has else zero)
            r += bool(n or not has)
        ends = [0]
        for n in rests:
            ends.append(ends[-1] + n)
        self.weights = torch.stack([torch.ones_like(signs[:ROW]), signs[:ROW]]).to(device=device, dtype=dtype)
        parts = [signs[:n] for n in rests]
        self.rest_signs = (torch.cat(parts) if parts else signs[:0]).to(device=device, dtype=dtype)
        self.rest_ends = torch.tensor(ends, dtype=torch.int64).to(device)
        self.column_of = torch.tensor(column_of, dtype=torch.int64).to(device)
        self.rest_of = torch.tensor(rest_of, dtype=torch.int64).to(device)


class Marker:
    """Computes fingerprints; keeps the +-1 vectors per device and dtype for the duration of a
    check (:meth:`release` drops them; they are rebuilt from the seed in microseconds).

    Args:
        scale: tolerance mode: the float projection and the sum of squares; without it (exact
            mode), the integer projection and 0.
    """

    def __init__(self, scale: bool = True) -> None:
        self.scale = scale
        self._signs: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
        #: The layout of the last batch: the check's tensors, the same at every check.
        self._last_layout: Optional[tuple[Any, _Layout]] = None

    def release(self) -> None:
        """Drop the +-1 vectors (the layout of the check's tensors is kept: a few bytes per
        element of a row of :data:`ROW` per tensor)."""
        self._signs.clear()

    def signs(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The seeded +-1 vector of :data:`ROW` elements (exact in every dtype), twice over."""
        key = (device, dtype)
        signs = self._signs.get(key)
        if signs is None:
            g = torch.Generator().manual_seed(SEED)
            host = torch.randint(0, 2, (ROW,), generator=g).mul_(2).sub_(1)
            signs = self._signs[key] = host.repeat(2).to(device=device, dtype=dtype)
        return signs

    def _word_sums(self, values: list[torch.Tensor], device: torch.device) -> torch.Tensor:
        """``[bits, dot]`` of every tensor, as an (n, 2) int64 tensor on ``device``."""
        words = [_words(v) for v in values]
        groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for i, w in enumerate(words):
            groups.setdefault((w.device, w.dtype), []).append(i)
        if len(groups) == 1:  # the usual case: one dtype on one device
            return self._batch(words).to(device=device, dtype=torch.int64)
        out = torch.empty((len(words), 2), dtype=torch.int64, device=device)
        for idx in groups.values():
            out[torch.tensor(idx, device=device)] = self._batch([words[i] for i in idx]).to(device, torch.int64)
        return out

    def _batch(self, words: list[torch.Tensor]) -> torch.Tensor:
        """``[bits, dot]`` of tensors of one word dtype on one device, in that width: the column
        sums of each tensor of ``ROW`` words or more (one pass over it), then a few kernels for
        all of them at once."""
        device, dtype = words[0].device, words[0].dtype
        columns: list[torch.Tensor] = []  # one row of ROW column sums per tensor of >= ROW words
        rests: list[torch.Tensor] = []  # last partial rows, and tensors under ROW words
        shape: list[tuple[bool, int]] = []
        for w in words:
            rows, tail = divmod(w.numel(), ROW)
            if rows:
                columns.append(w[: rows * ROW].view(rows, ROW).sum(dim=0, dtype=dtype))
            if tail or not rows:
                rests.append(w[rows * ROW:])  # positions from 0, like a row's
            shape.append((rows > 0, tail if rows else w.numel()))
        layout = self._layout(tuple(shape), device, dtype)
        parts: list[torch.Tensor] = []
        if columns:  # plain and signed sums of every row of column sums at once: (C, 2)
            parts.append((torch.stack(columns).unsqueeze(1) * layout.weights).sum(dim=2, dtype=dtype))
        if rests:
            # Pieces of different lengths, joined: running sums (they wrap in the words' width,
            # so they are exact), differenced at each piece's end: (R, 2).
            joined = rests[0] if len(rests) == 1 else torch.cat(rests)
            both = torch.stack([joined, joined * layout.rest_signs])
            running = torch.cat([torch.zeros((2, 1), dtype=dtype, device=device),
                                 both.cumsum(dim=1, dtype=dtype)], dim=1)
            parts.append(running.index_select(1, layout.rest_ends).diff(dim=1).T)
        parts.append(torch.zeros((1, 2), dtype=dtype, device=device))  # for a tensor without one part
        table = torch.cat(parts)
        return table.index_select(0, layout.column_of) + table.index_select(0, layout.rest_of)

    def _layout(self, shape: tuple[tuple[bool, int], ...], device: torch.device, dtype: torch.dtype) -> _Layout:
        """The index tensors of one layout of tensors (per tensor: whether it has a row of
        column sums, and the length of its rest); the last one is kept (a check's tensors are
        the same at every check)."""
        key = (shape, device, dtype)
        if self._last_layout is not None and self._last_layout[0] == key:
            return self._last_layout[1]
        layout = _Layout(shape, self.signs(torch.device("cpu"), dtype), device, dtype)
        self._last_layout = (key, layout)
        return layout

    def _float_dot(self, values: torch.Tensor) -> torch.Tensor:
        """The +-1 projection of a 1-D tensor's values, float64 0-d on its device."""
        n = values.numel()
        floating = values.dtype.is_floating_point
        signs = self.signs(values.device, values.dtype if floating else torch.float32)[:ROW]
        acc = torch.float64 if values.dtype == torch.float64 else torch.float32
        rows, tail = divmod(n, ROW)
        parts: list[torch.Tensor] = []
        if rows:
            parts.append((values[: rows * ROW].view(rows, ROW) * signs).sum(dim=1, dtype=acc))
        if tail or not rows:
            parts.append((values[rows * ROW:] * signs[:tail]).sum(dtype=acc).reshape(1))
        return _ordered_sum(parts[0] if len(parts) == 1 else torch.cat(parts))

    def rows(self, tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
        """One fingerprint row per tensor, as an (n, 3) int64 tensor on ``device``: computed on
        the tensors' own device and moved once."""
        if not tensors:
            return torch.zeros((0, 3), dtype=torch.int64, device=device)
        values = [flat(t) for t in tensors]
        pairs = self._word_sums(values, device)  # (n, 2): bits, integer projection
        if not self.scale:
            return torch.cat([pairs, torch.zeros_like(pairs[:, :1])], dim=1)
        bits = pairs[:, 0]
        dots = _stack([self._float_dot(v) for v in values], device, torch.float64)
        sq = _stack(_norms(values), device, torch.float64).square()
        return torch.stack([bits, dots.view(torch.int64), sq.view(torch.int64)], dim=1)

    def marks(self, values: torch.Tensor) -> torch.Tensor:
        """``[bits, dot, sq]`` of a 1-D tensor (from :func:`flat`), as an int64 (3,) tensor on
        its device; in tolerance mode the two floats are float64 bit patterns."""
        return self.rows([values], values.device)[0]

    def piece_rows(self, values: torch.Tensor, bounds: Sequence[tuple[int, int]],
                   device: torch.device) -> torch.Tensor:
        """Fingerprints of the pieces ``values[lo:hi]`` of a 1-D tensor, as (len(bounds), 3)."""
        return self.rows([values[lo:hi] for lo, hi in bounds], device)


def _stack(scalars: list[torch.Tensor], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """0-d tensors stacked as ``dtype`` on ``device``: one stack and one conversion when they
    share a device and a dtype (the usual case), else one of each per tensor."""
    if len({(s.device, s.dtype) for s in scalars}) == 1:
        return torch.stack(scalars).to(device=device, dtype=dtype)
    return torch.stack([s.to(device=device, dtype=dtype) for s in scalars])


def _norms(values: list[torch.Tensor]) -> list[torch.Tensor]:
    """L2 norms accumulated in float64 (tolerance mode's scale), one foreach call per device."""
    out: list[torch.Tensor] = [torch.zeros((), dtype=torch.float64, device=v.device) for v in values]
    groups: dict[torch.device, list[int]] = {}
    for i, v in enumerate(values):
        if v.numel() and (v.is_floating_point()):
            groups.setdefault(v.device, []).append(i)
        elif v.numel():
            out[i] = torch.linalg.vector_norm(v.to(torch.float64))
    for idx in groups.values():
        for i, n in zip(idx, torch._foreach_norm([values[i] for i in idx], 2, dtype=torch.float64)):
            out[i] = n
    return out
