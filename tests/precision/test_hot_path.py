"""The precision probe reads nothing back on the hot path, launches nothing on ordinary steps,
and a float32 run with the defaults pays nothing at all (audited at the dispatcher)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from helpers import Transformer
from torch.nn import functional as F

import torch_sentinel
from torch_sentinel.testing import count_host_syncs, count_launches

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ALL = ("bf16", "fp16", "e4m3", "e5m2")


def _loop(precision: Any, check: str, counted: range, counter: Any, dtype: torch.dtype = torch.float32) -> tuple[int, dict[str, int]]:
    """Train a small transformer; count with ``counter`` over the steps in ``counted``."""
    torch.manual_seed(0)
    model = Transformer()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    options = {} if precision is None else {"precision": precision}
    total, ops = 0, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch_sentinel.attach(model, opt, check=check, flush_every=1000, **options):
            for step in range(counted.stop):
                tokens = torch.randint(0, 50, (4, 8), generator=g)
                y = torch.randint(0, 4, (4,), generator=g)
                with counter() if step in counted else _nothing() as c:
                    opt.zero_grad()
                    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not torch.float32):
                        loss = F.cross_entropy(model(tokens).float(), y)
                    loss.backward()
                    opt.step()
                if c is not None:
                    total += c.count
                    for k, v in c.ops.items():
                        ops[k] = ops.get(k, 0) + v
    return total, ops


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


@pytest.mark.parametrize("check", ["immediate", "deferred"], ids=["immediate", "deferred"])
def test_sampled_steps_add_no_host_reads(check: str) -> None:
    steps = range(0, 12)  # ten sampled steps, one ordinary one, and step 10
    off, _ = _loop((), check, steps, count_host_syncs)
    on, ops = _loop(ALL, check, steps, count_host_syncs)
    assert on == off, ops


@pytest.mark.parametrize("check", ["immediate", "deferred"], ids=["immediate", "deferred"])
def test_ordinary_steps_launch_nothing_more(check: str) -> None:
    ordinary = range(101, 111)  # between the sampled steps 100 and 150
    off, _ = _loop((), check, ordinary, count_launches)
    on, ops = _loop(ALL, check, ordinary, count_launches)
    assert on == off, ops
    sampled_off, _ = _loop((), check, range(100, 101), count_launches)
    sampled_on, sampled_ops = _loop(ALL, check, range(100, 101), count_launches)
    # A sampled step pays: its histograms are counted (bincount on CPU, index_add_ on accelerators).
    assert sampled_on > sampled_off and sampled_ops.get("bincount", 0) + sampled_ops.get("index_add_", 0) > 0


def test_sampled_steps_3_to_9_take_only_amax_without_a_histogram() -> None:
    _, amax_ops = _loop(ALL, "immediate", range(3, 10), count_launches)
    _, histogram_ops = _loop(ALL, "immediate", range(10, 11), count_launches)
    assert "bincount" not in amax_ops and amax_ops.get("amax", 0) > 0, amax_ops
    assert histogram_ops.get("bincount", 0) > 0, histogram_ops


def test_a_float32_run_with_the_defaults_pays_nothing_even_on_sampled_steps() -> None:
    steps = range(0, 3)
    off, _ = _loop((), "deferred", steps, count_launches)
    default, ops = _loop(None, "deferred", steps, count_launches)
    assert default == off, ops
    bf16, bf16_ops = _loop(None, "deferred", steps, count_launches, dtype=torch.bfloat16)
    bf16_off, _ = _loop((), "deferred", steps, count_launches, dtype=torch.bfloat16)
    histograms = bf16_ops.get("bincount", 0) + bf16_ops.get("index_add_", 0)  # CPU: bincount
    assert bf16 > bf16_off and histograms > 0  # autocast bf16: watched by default
