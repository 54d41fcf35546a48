"""``torch-sentinel precision RUN_DIR``: golden table and JSON, a real run, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import torch_sentinel
from torch_sentinel.cli import main
from torch_sentinel.precision.monitor import ROW_FIELDS

GOLDEN = Path(__file__).resolve().parent.parent / "golden"


@pytest.mark.parametrize(("args", "golden"), [([], "precision_run.txt"), (["--json"], "precision_run.json")],
                         ids=["table", "json"])
def test_golden_precision(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                          args: list[str], golden: str) -> None:
    # precision_run/ holds the rows of steps 10 and 20 of a real run (a linear stack whose input
    # grows x1.3 a step from 2**-20, fp16 and e4m3 watched) and a last line cut short by a crash.
    # The golden files are the reviewed output; regenerate them with
    #   cd tests/golden && torch-sentinel precision [--json] precision_run > <golden>
    monkeypatch.chdir(GOLDEN)
    assert main(["precision", *args, "precision_run"]) == 0
    out, err = capsys.readouterr()
    assert out == (GOLDEN / golden).read_text()
    assert "skipping precision_run/precision.jsonl:17" in err


def test_rows_are_the_latest_step_of_each_tensor_and_format_worst_first(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["precision", "--json", str(GOLDEN / "precision_run")]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 8 and {r["step"] for r in rows} == {20}
    assert all(list(r) == list(ROW_FIELDS) for r in rows)
    ahead = [r["steps_to_overflow"] for r in rows]
    assert ahead == sorted(ahead)  # nothing saturates here: the nearest overflow first


def test_a_real_run_is_read_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with torch_sentinel.attach(model, opt, log_dir=str(tmp_path), precision=("e5m2",)):
        for _ in range(12):
            opt.zero_grad()
            model(torch.randn(4, 8) * 1e5).mean().backward()
            opt.step()
    assert main(["precision", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["module", "tensor", "format", "step", "flushed", "subnormal", "saturated", "amax",
                              "headroom", "overflow", "in"]
    first = out[2].split()
    assert first[2:4] == ["e5m2", "10"] and first[-1] == "now"  # inputs of 1e5 saturate e5m2 (57344)


def test_a_run_without_rows_or_a_missing_directory_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with torch_sentinel.attach(nn.Linear(2, 2), log_dir=str(tmp_path / "fp32")):
        pass
    assert main(["precision", str(tmp_path / "fp32")]) == 2
    assert "holds no precision.jsonl: the run watched no format" in capsys.readouterr().err
    assert main(["precision", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
