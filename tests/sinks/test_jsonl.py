"""JsonlSink: findings.jsonl holds one finding (or note) per line, readable back as Findings."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from helpers import MLP, make_batch
from torch import nn

import torch_sentinel
from torch_sentinel import Finding


def test_findings_and_notes_round_trip(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    sentinel = torch_sentinel.attach(
        model, opt, log_dir=str(tmp_path), on_nonfinite="record", check="deferred"
    )
    path = tmp_path / "findings.jsonl"
    assert path.exists() and path.read_text() == ""  # created at attach: watched, nothing found yet
    for step in range(5):
        x, y = make_batch("mlp", generator=g)
        if step == 3:
            x[1, 2] = float("inf")
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    sentinel.note(symptom="inf at step 3", hypothesis="bad batch", change="filter batch")
    report = sentinel.report()
    sentinel.detach()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    notes = [r for r in rows if r["kind"] == "note"]
    findings = [Finding.from_dict(r) for r in rows if r["kind"] != "note"]
    assert sorted(findings, key=str) == sorted(report.findings, key=str)
    (nonfinite,) = [f for f in findings if f.kind == "non_finite"]
    assert nonfinite.step == 3 and nonfinite.boundary == "data"
    assert notes == [
        {
            "kind": "note",
            "step": 5,
            "symptom": "inf at step 3",
            "hypothesis": "bad batch",
            "change": "filter batch",
        }
    ]


def test_a_rerun_appends(tmp_path: Path) -> None:
    for _ in range(2):
        torch.manual_seed(0)
        model = MLP()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with torch_sentinel.attach(model, opt, log_dir=str(tmp_path)) as sentinel:
            sentinel.note(symptom="run")
    lines = (tmp_path / "findings.jsonl").read_text().splitlines()
    assert [json.loads(line)["symptom"] for line in lines] == ["run", "run"]


def test_verdicts_at_detach_reach_the_file_without_report(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_sentinel.attach(model, opt, log_dir=str(tmp_path)):
        for _ in range(4):  # backward without optimizer.step(): only finish() can tell
            x, y = make_batch("mlp")
            nn.functional.cross_entropy(model(x), y).backward()
    kinds = [
        json.loads(line)["kind"] for line in (tmp_path / "findings.jsonl").read_text().splitlines()
    ]
    assert "no_update" in kinds
