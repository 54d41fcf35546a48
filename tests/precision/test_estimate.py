"""The underflow share estimated for tensors already rounded to the format (fp16 gradients):
close to the truth for a density flat near 0, below it otherwise, never above it."""

from __future__ import annotations

import pytest
import torch
from precision.reference import LAYOUT, histogram

from torch_sentinel.precision.derive import flushed_share, format_figures, tensor_figures
from torch_sentinel.precision.formats import FORMATS

FP16 = FORMATS["fp16"]


def _shares(x: torch.Tensor) -> tuple[float, float, str]:
    true = ((x != 0) & (x.half() == 0)).sum().item() / (x != 0).sum().item()
    counts, amax = histogram(x.half())  # what the sentinel sees of an fp16 gradient
    tensor = tensor_figures(counts, amax, LAYOUT)
    f = format_figures(LAYOUT.tails(counts), tensor, LAYOUT, FP16)
    estimate, basis = flushed_share(int(f.flushed_count[0]), int(f.at_min_subnormal[0]),
                                    int(tensor.zeros[0]), int(tensor.nonzero[0]))
    return true, estimate, basis


@pytest.mark.parametrize("exponent", [-20, -22], ids=["2^-20", "2^-22"])
def test_a_flat_density_near_zero_is_estimated_closely(exponent: int) -> None:
    x = torch.randn(200_000, generator=torch.Generator().manual_seed(0)) * 2.0**exponent
    true, estimate, basis = _shares(x)
    assert basis == "extrapolated"
    assert estimate == pytest.approx(true, rel=0.1)


@pytest.mark.parametrize("kind", ["normal", "product", "lognormal"])
@pytest.mark.parametrize("exponent", [-20, -24, -26], ids=["2^-20", "2^-24", "2^-26"])
def test_the_estimate_stays_below_the_truth(kind: str, exponent: int) -> None:
    g = torch.Generator().manual_seed(1)
    base = {"normal": lambda: torch.randn(100_000, generator=g),
            "product": lambda: torch.randn(100_000, generator=g) * torch.randn(100_000, generator=g),
            "lognormal": lambda: torch.exp(torch.randn(100_000, generator=g) * 2)}[kind]()
    true, estimate, _ = _shares(base * 2.0**exponent)
    assert 0 < estimate <= true * 1.02


def test_values_finer_than_the_format_are_counted_exactly() -> None:
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(2)) * 2.0**-22
    counts, amax = histogram(x)  # float32, not rounded yet: the cast flushes some
    tensor = tensor_figures(counts, amax, LAYOUT)
    f = format_figures(LAYOUT.tails(counts), tensor, LAYOUT, FP16)
    share, basis = flushed_share(int(f.flushed_count[0]), int(f.at_min_subnormal[0]), int(tensor.zeros[0]),
                                 int(tensor.nonzero[0]))
    assert basis == "cast"
    assert share == ((x != 0) & (x.half() == 0)).sum().item() / (x != 0).sum().item()
