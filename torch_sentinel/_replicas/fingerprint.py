"""Fingerprints of tensors, computed on the tensors' own device: no host copy of the values.

A fingerprint is three numbers, kept as one int64 row so that one collective carries any number
of them:

- ``bits``: the sum of the tensor's bit pattern, read as integer words (float32 as int32; pairs
  of bf16/fp16 values as int32 when they align, else int16; float64 as int64). The words are
  summed in their own width, so the sum wraps (two's complement): modular addition does not
  depend on the order of the terms, so every rank, every thread count and every device gets the
  same sum for the same bits, and any single flipped bit changes it (by +-2^k, never 0 modulo
  the word width).
- ``dot``: the float64 dot product of the values with a seeded +-1 vector (its bits, as int64).
  It catches what the integer sum cancels (two flips of the same bit in opposite directions),
  and it is what tolerance mode compares. The values are converted to float64 a chunk at a
  time in a reused scratch buffer (the memory cost is two chunks, not a copy of the tensor), and
  each chunk's products are summed by torch's own reduction (not BLAS, whose sum order depends
  on the thread count), so the same bits give the same float on the same kind of device.
- ``sq``: the float64 sum of squares (its bits, as int64): the scale of the tensor, against
  which tolerance mode measures a difference of ``dot``. Exact mode does not need it and sends
  0 (16 bytes of fingerprint a tensor, one pass less).

The +-1 vector has the length of one chunk and repeats for every chunk.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._collect.shards import local

__all__ = ["SEED", "Marker", "flat", "word_sum"]

#: Seed of the +-1 vector: the same on every rank, so no rank has to send it.
SEED = 0x5E171E1

#: Elements converted to float64 at a time: a chunk and its products stay in a CPU's L2 cache;
#: on accelerators larger chunks mean fewer kernel launches (2 x 8 MB of scratch).
_CHUNK = {"cpu": 1 << 15}
_CHUNK_DEFAULT = 1 << 20

_WORDS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def flat(t: torch.Tensor) -> torch.Tensor:
    """The local values of ``t`` as one contiguous 1-D real tensor (a view when possible)."""
    t = local(t).detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.reshape(-1)


def word_sum(values: torch.Tensor) -> torch.Tensor:
    """The wrapping sum of the bit pattern of a 1-D tensor, as an int64 0-d tensor (device op)."""
    size = values.element_size()
    words_dtype = _WORDS[size]
    if size < 4 and (values.numel() * size) % 4 == 0 and (values.storage_offset() * size) % 4 == 0:
        words_dtype = torch.int32  # pairs of 16-bit values: a wider word, fewer collisions
    if values.dtype == torch.bool:
        values = values.view(torch.int8)
    words = values.view(words_dtype)
    return words.sum(dtype=words_dtype).to(torch.int64)


class _Scratch:
    """The +-1 vector and two float64 buffers of one chunk on one device."""

    def __init__(self, device: torch.device) -> None:
        self.chunk = _CHUNK.get(device.type, _CHUNK_DEFAULT)
        g = torch.Generator().manual_seed(SEED)
        signs = torch.randint(0, 2, (self.chunk,), generator=g).to(torch.float64).mul_(2).sub_(1)
        self.signs = signs.to(device)
        self.values = torch.empty(self.chunk, dtype=torch.float64, device=device)
        self.products = torch.empty(self.chunk, dtype=torch.float64, device=device)


class Marker:
    """Computes fingerprints; keeps one scratch per device for the duration of a check.

    Call :meth:`release` after a check to give the scratch memory back (the +-1 vector is
    rebuilt from the seed, in a few microseconds, at the next one).

    Args:
        scale: compute ``sq`` (tolerance mode); without it, ``sq`` is sent as 0.
    """

    def __init__(self, scale: bool = True) -> None:
        self.scale = scale
        self._scratch: dict[torch.device, _Scratch] = {}

    def release(self) -> None:
        self._scratch.clear()

    def _on(self, device: torch.device) -> _Scratch:
        scratch = self._scratch.get(device)
        if scratch is None:
            scratch = self._scratch[device] = _Scratch(device)
        return scratch

    def marks(self, values: torch.Tensor) -> torch.Tensor:
        """``[bits, dot, sq]`` of a 1-D tensor (from :func:`flat`), as an int64 (3,) tensor on
        its device; the two floats are float64 bit patterns."""
        if values.numel() == 0:
            return torch.zeros(3, dtype=torch.int64, device=values.device)
        scratch = self._on(values.device)
        chunks = values.split(scratch.chunk)
        parts = torch.empty((len(chunks), 2), dtype=torch.float64, device=values.device)
        for i, chunk in enumerate(chunks):
            n = chunk.numel()
            buf, prod = scratch.values[:n], scratch.products[:n]
            buf.copy_(chunk)  # exact: every float32/bf16/fp16 value is a float64
            torch.mul(buf, scratch.signs[:n], out=prod)
            torch.sum(prod, dim=0, out=parts[i, 0])
            if self.scale:
                torch.mul(buf, buf, out=prod)
                torch.sum(prod, dim=0, out=parts[i, 1])
        if not self.scale:
            parts[:, 1] = 0.0
        floats = parts[0] if len(chunks) == 1 else parts.sum(dim=0)
        return torch.cat([word_sum(values).reshape(1), floats.view(torch.int64)])

    def rows(self, tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
        """One fingerprint row per tensor, stacked as an (n, 3) int64 tensor on ``device``."""
        if not tensors:
            return torch.zeros((0, 3), dtype=torch.int64, device=device)
        return torch.stack([self.marks(flat(t)).to(device) for t in tensors])

    def piece_rows(self, values: torch.Tensor, bounds: Sequence[tuple[int, int]],
                   device: torch.device) -> torch.Tensor:
        """Fingerprints of the pieces ``values[lo:hi]`` of a 1-D tensor, as (len(bounds), 3)."""
        return torch.stack([self.marks(values[lo:hi]).to(device) for lo, hi in bounds])
