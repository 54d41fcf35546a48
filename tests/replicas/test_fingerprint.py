"""Fingerprints: every flipped bit shows, cancelling flips show in the projection, and the same
bits give the same fingerprint whatever the thread count."""

from __future__ import annotations

import pytest
import torch

from torch_sentinel._replicas.fingerprint import ROW, Marker, flat, word_sum

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


@pytest.mark.parametrize("bit", [0, 12, 30], ids=["lsb", "mantissa-12", "exponent-msb"])
def test_two_flips_that_cancel_in_the_integer_sum_show_in_the_projection(bit: int) -> None:
    # Exact mode weighs the words by the +-1 vector. Bit `bit` goes up in word i (in the last,
    # partial row) and down in word j: the plain sum is blind; the projection moves by
    # 2 * 2^bit when i and j got opposite signs, and cancels too when they got the same sign
    # (so half of such pairs, at random positions, go unseen).
    g = torch.Generator().manual_seed(1)
    words = torch.randint(-(1 << 31), (1 << 31) - 1, (3 * ROW + 100,), generator=g, dtype=torch.int64)
    words = words.to(torch.int32)
    marker = Marker(scale=False)
    signs = marker.signs(torch.device("cpu"), torch.int32)[:ROW]
    i = 3 * ROW + 10
    for j, seen in ((next(j for j in range(ROW) if signs[j] != signs[i % ROW]), True),
                    (next(j for j in range(ROW) if signs[j] == signs[i % ROW]), False)):
        t = words.clone()
        t[i] &= ~(1 << bit)
        t[j] |= 1 << bit
        changed = t.clone()
        changed[i] |= 1 << bit
        changed[j] &= ~(1 << bit)
        before = marker.marks(flat(t.view(torch.float32)))
        after = marker.marks(flat(changed.view(torch.float32)))
        assert after[0] == before[0]  # the integer sum is blind to the pair
        assert bool(after[1] != before[1]) is seen, (j, bit)
        assert after[2] == before[2] == 0  # exact mode sends no scale


@pytest.mark.parametrize("bit", [0, 16, 30], ids=["lsb", "mantissa-16", "exponent-msb"])
def test_exact_fingerprint_sees_any_single_flip_in_a_large_tensor(bit: int) -> None:
    t = _values(torch.float32, n=(1 << 20) + 77)
    marker = Marker(scale=False)
    before = marker.marks(flat(t))
    for index in (0, 123_457, (1 << 20) + 50):  # a full row, a middle one, the partial last row
        after = marker.marks(flat(_flipped(t, index, bit)))
        assert after[0] != before[0] and after[1] != before[1], index  # +-2^bit in both sums


def test_tolerance_projection_sees_a_change_above_float32_rounding() -> None:
    # Tolerance mode sums rows of float32 products in float32: a 1-ulp change may round away
    # (the integer sum still sees it), a change of 2^-10 of one element does not.
    t = _values(torch.float32, n=1 << 20)
    marker = Marker()
    before = marker.marks(flat(t))
    after = marker.marks(flat(_flipped(t, 123_457, 13)))
    assert (after != before).all()  # bits, the float64 projection, and the sum of squares
    lsb = marker.marks(flat(_flipped(t, 123_457, 0)))
    assert lsb[0] != before[0] and lsb[2] != before[2]


@pytest.mark.parametrize("scale", [False, True], ids=["exact", "tolerance"])
def test_same_bits_same_fingerprint_whatever_the_thread_count(scale: bool) -> None:
    t = _values(torch.float32, n=300_001)
    previous = torch.get_num_threads()
    try:
        rows = []
        for threads in (1, 2, 4):
            torch.set_num_threads(threads)
            rows.append(Marker(scale).marks(flat(t)).tolist())
    finally:
        torch.set_num_threads(previous)
    assert rows[0][:2] == rows[1][:2] == rows[2][:2]  # bits and projection: compared exactly


@pytest.mark.parametrize("scale", [False, True], ids=["exact", "tolerance"])
def test_pieces_and_odd_dtypes(scale: bool) -> None:
    marker = Marker(scale)
    for t in (torch.ones(5, dtype=torch.bool), torch.arange(7), torch.randn(3, 2, dtype=torch.complex64),
              torch.empty(0)):
        row = marker.marks(flat(t))
        assert row.shape == (3,) and row.dtype == torch.int64
    values = flat(_values(torch.bfloat16))
    rows = marker.piece_rows(values, [(0, 333), (333, 666), (666, 1001)], torch.device("cpu"))
    assert rows.shape == (3, 3)
    whole = int(word_sum(values[0:1000]))  # even count: int32 words
    assert whole == int(word_sum(values[0:1000].clone()))
