"""Under torch.compile (inductor) the output histograms are traced into the graph: the rows of
the sampled steps match an eager run's, nothing breaks the graph, and a growing activation is
still reported before it overflows. Marked ``inductor`` (tens of seconds on CPU)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Optional

import pytest
import torch
from precision.reference import RowSink
from torch import nn
from torch._dynamo.utils import counters

import torch_sentinel

pytestmark = [pytest.mark.inductor, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _run(compiled: bool, steps: int = 25) -> tuple[RowSink, list[torch_sentinel.Finding]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64, bias=False), nn.GELU(), nn.Linear(64, 64), nn.LayerNorm(64), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sink = RowSink()
    sentinel = torch_sentinel.attach(model, opt, check="deferred", flush_every=5, precision=("fp16", "e4m3"),
                                     disable={"no_update", "unnormalized_input", "diverging"})
    sentinel.add_sink(sink)
    run = torch.compile(model) if compiled else model
    x0 = torch.randn(32, 16, generator=torch.Generator().manual_seed(0))
    for step in range(steps):
        opt.zero_grad()
        run(x0 * 1.3**step).mean().backward()
        opt.step()
    sentinel.detach()
    return sink, sentinel.findings


def test_compiled_rows_match_eager_ones_and_the_graph_holds() -> None:
    eager, eager_findings = _run(compiled=False)
    compiled, compiled_findings = _run(compiled=True)
    assert dict(counters["graph_break"]) == {}
    steps = sorted({r.step for r in compiled.rows})
    # Histogram steps only (3-9 are amax samples), though the graph runs every step.
    assert steps == [0, 1, 2, 10, 20]
    for module in ("0", "2", "3", "4"):
        for fmt in ("fp16", "e4m3"):
            got, want = compiled.of(module, "activation", fmt), eager.of(module, "activation", fmt)
            assert [r.step for r in got] == [r.step for r in want] == steps
            for g, w in zip(got, want):
                # inductor's kernels may round a value differently from eager's by an ulp
                assert g.amax == pytest.approx(w.amax, rel=1e-5)
                assert (g.flushed, g.subnormal, g.saturated) == pytest.approx((w.flushed, w.subnormal, w.saturated), abs=1e-3)
    def overflow(findings: list[torch_sentinel.Finding]) -> set[tuple[Optional[str], str]]:
        return {(f.module, f.evidence["format"]) for f in findings if f.kind == "precision_overflow"}

    assert overflow(compiled_findings) == overflow(eager_findings) != set()
