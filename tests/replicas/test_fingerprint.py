"""Fingerprints: every flipped bit shows, cancelling flips show in the projection, and the same
bits give the same fingerprint whatever the thread count."""

from __future__ import annotations

import pytest
import torch

from torch_sentinel._replicas.fingerprint import Marker, flat, word_sum

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
WORDS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16,
         torch.float64: torch.int64}


def _values(dtype: torch.dtype, n: int = 1001, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * 0.05).to(dtype)


def _flipped(t: torch.Tensor, index: int, bit: int) -> torch.Tensor:
    out = t.clone()
    words = out.view(WORDS[t.dtype])
    bits = 8 * t.element_size()
    mask = torch.tensor(1, dtype=torch.int64).bitwise_left_shift(bit)
    if bit == bits - 1:
        mask = -mask  # the sign bit of the word
    words[index] ^= mask.to(words.dtype)
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d).removeprefix("torch.") for d in DTYPES])
def test_every_single_bit_flip_changes_the_integer_sum(dtype: torch.dtype) -> None:
    t = _values(dtype)
    base = int(word_sum(flat(t)))
    for bit in range(8 * t.element_size()):
        for index in (0, 500, 1000):  # 1001 elements: odd, so 16-bit values are summed as int16
            assert int(word_sum(flat(_flipped(t, index, bit)))) != base, (bit, index)


def test_two_flips_that_cancel_in_the_integer_sum_show_in_the_projection() -> None:
    t = torch.tensor([1.0, 1.0, 0.5, 0.25], dtype=torch.float32)
    words = t.view(torch.int32)
    words[0] += 1  # the mantissa LSB of one value goes up...
    words[1] -= 1  # ...and of another goes down: the integer sum is unchanged
    marker = Marker()
    before = marker.marks(flat(torch.tensor([1.0, 1.0, 0.5, 0.25])))
    after = marker.marks(flat(t))
    assert after[0] == before[0]
    signs = marker._on(torch.device("cpu")).signs[:2]
    if signs[0] != signs[1]:
        assert after[1] != before[1]
    else:  # the +-1 vector gives both elements the same sign: the float sum cancels too
        assert after[1] == before[1]


def test_projection_sees_a_one_ulp_change_in_a_large_tensor() -> None:
    t = _values(torch.float32, n=1 << 20)
    marker = Marker()
    before = marker.marks(flat(t))
    after = marker.marks(flat(_flipped(t, 123_457, 0)))
    assert (after != before).all()  # bits, the float64 projection, and the sum of squares


def test_same_bits_same_fingerprint_whatever_the_thread_count() -> None:
    t = _values(torch.float32, n=300_001)
    previous = torch.get_num_threads()
    try:
        rows = []
        for threads in (1, 2, 4):
            torch.set_num_threads(threads)
            rows.append(Marker().marks(flat(t)).tolist())
    finally:
        torch.set_num_threads(previous)
    assert rows[0][:2] == rows[1][:2] == rows[2][:2]  # bits and projection: compared exactly


def test_pieces_and_odd_dtypes() -> None:
    marker = Marker()
    for t in (torch.ones(5, dtype=torch.bool), torch.arange(7), torch.randn(3, 2, dtype=torch.complex64),
              torch.empty(0)):
        row = marker.marks(flat(t))
        assert row.shape == (3,) and row.dtype == torch.int64
    values = flat(_values(torch.bfloat16))
    rows = marker.piece_rows(values, [(0, 333), (333, 666), (666, 1001)], torch.device("cpu"))
    assert rows.shape == (3, 3)
    whole = int(word_sum(values[0:1000]))  # even count: int32 words
    assert whole == int(word_sum(values[0:1000].clone()))
