"""Device cost of one histogram, against the alternatives, per element (interleaved, CPU).

- ``histogram``: :func:`~torch_sentinel.precision.histogram.add_histogram` with a workspace (as
  the probe runs it on CPU) and without one (as on accelerators and under compile);
- ``frexp + lookup + bincount``: the textbook route (exponent from ``frexp``, the split bins
  from a per-binade mantissa threshold, ``bincount``), exact too, but ``bincount`` syncs on CUDA
  and breaks a compiled graph;
- ``bucketize``: ``torch.bucketize`` over the same sorted cuts;
- ``aminmax``: one reduction of the tensor, for scale (what the forward probe pays per output).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

from torch_sentinel.precision.histogram import DeviceTables, Workspace, add_histogram
from torch_sentinel.precision.layout import BinLayout, float32_from_bits

__all__ = ["run"]


def run(numel: int = 1 << 20, rounds: int = 15) -> dict[str, Any]:
    layout = BinLayout.default()
    tables = DeviceTables(layout, torch.device("cpu"))
    x = torch.randn(numel, generator=torch.Generator().manual_seed(0))
    row = torch.zeros(tables.width, dtype=torch.int64)
    workspace = Workspace(torch.device("cpu"))
    cuts = torch.from_numpy(float32_from_bits(torch.tensor(layout.cuts).numpy())).float()
    # frexp route: one threshold per binade (2 columns for the binades with two cuts)
    thresholds = torch.full((300, 2), 2.0)
    base = torch.arange(300, dtype=torch.int64) * 3

    def frexp_route() -> None:
        m, e = torch.frexp(x.abs())
        e = (e + 150).clamp_(0, 299).long()
        t = thresholds[e]
        index = base[e] + (m.unsqueeze(-1) >= t).sum(-1)
        row[:0].add_(torch.bincount(index, minlength=900)[:0])

    candidates: dict[str, Callable[[], None]] = {
        "histogram (workspace)": lambda: add_histogram(x, row, tables, workspace=workspace),
        "histogram (allocating)": lambda: add_histogram(x, row, tables),
        "frexp + lookup + bincount": frexp_route,
        "bucketize": lambda: torch.bincount(torch.bucketize(x.abs(), cuts, right=True), minlength=layout.bins + 1),
        "aminmax": lambda: torch.aminmax(x),
    }
    times: dict[str, list[float]] = {k: [] for k in candidates}
    for fn in candidates.values():
        fn()
    for _ in range(rounds):
        for name, fn in candidates.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {"numel": numel, "ns_per_element": {k: statistics.median(v) / numel * 1e9 for k, v in times.items()}}
