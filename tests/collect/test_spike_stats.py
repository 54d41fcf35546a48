"""Device statistics of the loss-spike forensics, against the plain computation they stand for."""

from __future__ import annotations

import math
from typing import Optional

import pytest
import torch

from torch_sentinel._collect.spike_stats import (
    max_attention_logit,
    max_attention_logits,
    mean_logsumexp,
)


def _calls(case: str) -> list[tuple[torch.Tensor, torch.Tensor, Optional[float]]]:
    g = torch.Generator().manual_seed(0)

    def qk(shape_q: tuple[int, ...], shape_k: tuple[int, ...], dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(shape_q, generator=g).to(dtype), torch.randn(shape_k, generator=g).to(dtype)

    same = [(*qk((3, 4, 32, 16), (3, 4, 32, 16)), None) for _ in range(4)]
    if case == "one-shape":
        return same
    if case == "mixed":
        return [*same[:2],
                (*qk((2, 8, 20, 8), (2, 2, 24, 8)), None),  # grouped-query attention, its own group
                (*qk((3, 4, 32, 16), (3, 4, 32, 16)), 0.3),  # another scale: another group
                (*qk((3, 4, 32, 16), (3, 4, 32, 16), torch.bfloat16), None),  # another dtype
                same[2]]
    return same[:1]


@pytest.mark.parametrize("case", ["one-shape", "mixed", "single"], ids=["one-shape", "mixed", "single"])
def test_batched_maxima_equal_one_call_at_a_time(case: str) -> None:
    calls = _calls(case)
    batched: dict[int, float] = {}
    groups = max_attention_logits(calls)
    for members, maxima in groups:
        assert maxima.shape == (len(members),)
        batched.update(zip(members, maxima.float().tolist()))
    assert sorted(batched) == list(range(len(calls)))
    for i, (q, k, scale) in enumerate(calls):
        assert batched[i] == float(max_attention_logit(q, k, scale)), f"call {i}"
    expected_groups = {"one-shape": 1, "mixed": 4, "single": 1}[case]
    assert len(groups) == expected_groups


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("scale", [1.0, 30.0, 3000.0], ids=["unit", "large", "huge"])
def test_the_output_log_sum_exp_is_torchs_to_float32_rounding(scale: float, dtype: torch.dtype) -> None:
    """``mean_logsumexp`` takes ``max(x) - max(log_softmax(x))``: torch's logsumexp of the
    first sequence, to float32 rounding, with a masked (``-inf``) vocabulary entry too."""
    logits = (torch.randn(3, 32, 256, generator=torch.Generator().manual_seed(0)) * scale).to(dtype)
    logits[0, :, 7] = -math.inf
    exact = float(torch.logsumexp(logits[0].double(), dim=-1).mean())
    out = torch.zeros(())
    value = mean_logsumexp(logits, out=out)
    assert value is out
    assert float(out) == pytest.approx(exact, rel=1e-6, abs=1e-5)
