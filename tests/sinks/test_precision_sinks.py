"""Precision rows on disk: TensorBoard tags read back with TensorBoard's own reader, and
``precision.jsonl``, both equal to the rows the detectors saw."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from precision.reference import RowSink
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

import torch_sentinel
from torch_sentinel.precision.monitor import ROW_FIELDS

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _train(log_dir: Path, steps: int = 25, **options: object) -> RowSink:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    sink = RowSink()
    g = torch.Generator().manual_seed(0)
    with torch_sentinel.attach(model, opt, log_dir=str(log_dir), precision=("fp16", "e4m3"), **options) as s:
        s.add_sink(sink)
        for _ in range(steps):
            x = torch.randn(8, 16, generator=g) * 100
            opt.zero_grad()
            model(x).mean().backward()
            opt.step()
    return sink


def test_tags_hold_each_rows_figures_at_its_sampled_step(tmp_path: Path) -> None:
    sink = _train(tmp_path, module_log_every=1)
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"precision/fp16/0/flushed", "precision/e4m3/2/saturated", "precision/fp16/0/grad/headroom_bits",
            "precision/e4m3/2/grad/subnormal"} <= tags
    written = 0
    for row in sink.rows:
        suffix = "grad/" if row.tensor == "gradient" else ""
        for name in ("flushed", "subnormal", "saturated", "headroom_bits"):
            events = {e.step: e.value for e in acc.Scalars(f"precision/{row.format}/{row.module}/{suffix}{name}")}
            assert events[row.step] == pytest.approx(getattr(row, name), rel=1e-6, abs=1e-12)
            written += 1
    assert written == len(sink.rows) * 4 and {r.step for r in sink.rows} == {0, 1, 2, 10, 20}  # histogram steps


def test_tags_follow_the_per_module_interval(tmp_path: Path) -> None:
    _train(tmp_path, module_log_every=10)
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    acc.Reload()
    steps = {e.step for e in acc.Scalars("precision/fp16/0/flushed")}
    assert steps == {0, 10, 20}  # sampled steps that are per-module steps


def test_precision_jsonl_holds_every_row(tmp_path: Path) -> None:
    sink = _train(tmp_path)
    lines = (tmp_path / "precision.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [r.to_dict() for r in sink.rows]
    assert list(json.loads(lines[0])) == list(ROW_FIELDS)
