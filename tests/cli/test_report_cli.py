"""``torch-sentinel report RUN_DIR``: golden text and JSON, real runs, and clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch
from helpers import MLP, make_batch
from torch import nn

import torch_sentinel
from torch_sentinel.cli import main

GOLDEN = Path(__file__).resolve().parent.parent / "golden"


@pytest.mark.parametrize(
    ("args", "golden"),
    [([], "report_run.txt"), (["--json"], "report_run.json")],
    ids=["text", "json"],
)
def test_golden_report(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    golden: str,
) -> None:
    # report_run/ holds a hand-written findings.jsonl (with a line cut short by a crash) and a
    # manifest.json; the golden files are the reviewed output. Regenerate them with
    #   cd tests/golden && torch-sentinel report [--json] report_run > <golden>
    monkeypatch.chdir(GOLDEN)
    assert main(["report", *args, "report_run"]) == 0
    out, err = capsys.readouterr()
    assert out == (GOLDEN / golden).read_text()
    assert "skipping report_run/findings.jsonl:5" in err


def train_run(log_dir: Path, steps: int = 22) -> list[float]:
    torch.manual_seed(0)
    model = MLP()
    with torch.no_grad():
        model.fc1.bias.fill_(-20.0)  # a dead layer, so there is a finding to report
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    losses = []
    with torch_sentinel.attach(model, opt, log_dir=str(log_dir), flush_every=5, log_every=5):
        for _ in range(steps):
            x, y = make_batch("mlp", generator=g)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


def test_report_of_a_real_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    losses = train_run(tmp_path)
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"final loss: train {losses[-1]:.4g} at step 21" in out  # dead_relu needs 20 steps
    assert "torch_sentinel diagnosis after 22 step(s)" in out
    assert "[warning] dead_relu (forward) in act" in out
    assert "  forward    FAIL  <- first failing boundary" in out
    assert out.rstrip().endswith("next check: inspect_initialization_and_learning_rate")
    assert main(["report", "--json", str(tmp_path)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["final"]["loss/train"] == {"step": 21, "value": pytest.approx(losses[-1], rel=1e-6)}
    assert "dead_relu" in {f["kind"] for f in data["findings"]}


def test_a_directory_of_runs_is_reported_run_by_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("b", "a"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "findings.jsonl").write_text("")
    (tmp_path / "not_a_run").mkdir()
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.index(f"run: {tmp_path / 'a'}") < out.index(f"run: {tmp_path / 'b'}")
    assert "not_a_run" not in out
    assert out.count("No faults found.") == 2


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: p, "holds no torch_sentinel run: no findings.jsonl"),
        (lambda p: (p / "f.txt", (p / "f.txt").write_text("x"))[0], "is a file, not a directory"),
    ],
    ids=["missing", "empty", "file"],
)
def test_bad_run_dir_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Callable[[Path], Path], message: str
) -> None:
    assert main(["report", str(make(tmp_path))]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("torch-sentinel report: error: ") and message in captured.err


def test_python_dash_m_runs_the_same_command(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch_sentinel", "report", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr
