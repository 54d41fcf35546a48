"""The histogram's figures equal counts on torch's own cast, ``x.to(dtype)``, for every format:
at the rounding edges (ties, one ulp either side), in the subnormals, at huge and tiny
scales, for float32, bfloat16 and float16 inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from precision.reference import LAYOUT, TABLES, cast_fractions, figures, histogram

from torch_sentinel.precision.derive import tensor_figures
from torch_sentinel.precision.formats import FORMATS, Format
from torch_sentinel.precision.histogram import Workspace, add_histogram
from torch_sentinel.precision.layout import NO_CUT

FMTS = list(FORMATS.values())
FMT_IDS = [f.name for f in FMTS]


def _adversarial(fmt: Format) -> torch.Tensor:
    """Every rounding edge of every format, exactly and one float32 ulp either side, ties,
    multiples of the smallest subnormal, the top of the range, zeros, infinities, NaN."""
    values: list[float] = [0.0, 2.0**-149, 2.0**-140, 2.0**-127, 3.0e38, 3.4e38, float(np.finfo(np.float32).max)]
    for f in FORMATS.values():
        for edge in f.edges.values():
            v = np.float32(edge.value)
            values += [float(v), float(np.nextafter(v, np.float32(0))), float(np.nextafter(v, np.float32(np.inf)))]
        q = f.min_subnormal
        values += [q * k / 4 for k in range(13)]
        values += [f.min_normal * (1 - 2.0**-k) for k in range(1, 14)]
        values += [f.max_finite * (1 + 2.0**-k) for k in range(1, 14)]
    x = torch.tensor(values, dtype=torch.float64).float()
    return torch.cat([x, -x, torch.tensor([float("inf"), -float("inf"), float("nan")])])


@pytest.mark.parametrize("fmt", FMTS, ids=FMT_IDS)
def test_rounding_edges_ties_and_subnormals_match_the_cast(fmt: Format) -> None:
    x = _adversarial(fmt)
    tensor, got = figures(x, fmt)
    assert got == pytest.approx(cast_fractions(x, fmt), abs=0)
    assert tensor.nonfinite[0] == (~torch.isfinite(x)).sum().item() and tensor.zeros[0] == (x == 0).sum().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("fmt", FMTS, ids=FMT_IDS)
def test_random_tensors_of_every_scale_match_the_cast(fmt: Format, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    low, high = (-150, 128) if dtype is not torch.float16 else (-26, 17)
    worst = 0.0
    for _ in range(60):
        exponent = float(torch.empty(1).uniform_(low, high, generator=g))
        x = (torch.randn(500, generator=g) * 2.0**exponent).to(dtype)
        _, got = figures(x, fmt)
        want = cast_fractions(x, fmt)
        worst = max(worst, *(abs(a - b) for a, b in zip(got, want)))
    assert worst == 0.0


def test_the_lookup_tables_hold_one_cut_per_key_range() -> None:
    base, cut = LAYOUT.tables()
    # an element's bin is base[key] + (bits >= cut[key]): check it against a plain search
    bits = np.random.default_rng(0).integers(0, 0x7FFFFFFF, 200_000)
    bits = np.concatenate([bits, np.asarray(LAYOUT.cuts), np.asarray(LAYOUT.cuts) - 1])
    key = bits >> 15
    got = base[key] + (bits >= cut[key])
    want = np.searchsorted(np.asarray(LAYOUT.cuts), bits, side="right")
    assert np.array_equal(got, want)
    # the cuts inside a key range: the strict edges, fp16's finer ones, "nonzero"
    inside = [c for c in LAYOUT.cuts if c % (1 << 15)]
    finite_keys = cut[: 0x7F800000 >> 15]
    assert (finite_keys != NO_CUT).sum() == len(inside) == 8


def test_every_nan_pattern_lands_in_the_nonfinite_bin() -> None:
    patterns = torch.tensor([0x7F800000, 0x7FC00000, 0x7F800001, 0x7FFFFFFF, -1], dtype=torch.int32)
    counts, amax = histogram(patterns.view(torch.float32))
    assert counts[0, -1] == 5 and counts[0, :-1].sum() == 0
    assert amax[0] == 0x7FFFFFFF  # not finite: the host falls back to the highest finite bin


def test_amax_is_exact_and_amin_a_lower_bound() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 33, generator=g).t() * 3.7  # not contiguous
    tensor, _ = figures(x, FORMATS["fp16"])
    assert tensor.amax[0] == x.abs().max().item()
    true_min = x.abs()[x != 0].min().item()
    assert true_min / 2 < tensor.amin_nonzero[0] <= true_min
    assert figures(x.contiguous(), FORMATS["fp16"])[1] == figures(x, FORMATS["fp16"])[1]


def test_nonfinite_values_are_counted_apart_and_amax_stays_finite() -> None:
    x = torch.tensor([1.0, -3.0, float("nan"), float("inf"), 0.0, 2.0**-30])
    tensor, (flushed, subnormal, saturated) = figures(x, FORMATS["fp16"])
    assert subnormal == 0.0
    assert (tensor.nonfinite[0], tensor.zeros[0], tensor.nonzero[0]) == (2, 1, 3)
    assert tensor.amax[0] == 2.0  # the lower edge of the highest finite bin, 3.0's binade
    assert (flushed, saturated) == (1 / 6, 0.0)
    empty = tensor_figures(np.zeros((1, LAYOUT.bins), dtype=np.int64), np.zeros(1, dtype=np.int64), LAYOUT)
    assert math.isnan(empty.amax[0]) and empty.numel[0] == 0


def test_a_scale_is_multiplied_in_before_counting() -> None:
    x = torch.full((10,), 2.0**-20)
    counts, _ = histogram(x, torch.tensor(2.0**16))
    tensor = tensor_figures(counts, histogram(x * 2.0**16)[1], LAYOUT)
    assert np.array_equal(counts, histogram(x * 2.0**16)[0])
    assert tensor.amax[0] == 2.0**-4


@pytest.mark.parametrize("chunk", [1 << 17, 64], ids=["one-chunk", "many-chunks"])
def test_the_workspace_path_counts_as_the_allocating_one(chunk: int) -> None:
    g = torch.Generator().manual_seed(3)
    tensors = [_adversarial(FORMATS["fp16"]), torch.randn(40, 30, generator=g).t() * 1e3,
               torch.randn(7, generator=g).half(), torch.randn(500, generator=g) * 2.0**-130,
               torch.randn(1001, generator=g) * 2.0**14]
    workspace = Workspace(torch.device("cpu"), chunk=chunk)
    with_ws = torch.zeros(TABLES.width, dtype=torch.int64)
    without = torch.zeros(TABLES.width, dtype=torch.int64)
    for x in tensors:  # the workspace grows and shrinks its views across sizes
        add_histogram(x, with_ws, TABLES, workspace=workspace)
        add_histogram(x, without, TABLES)
    assert torch.equal(with_ws, without)
