"""``torch-sentinel demo``: the lab's cases as real trainings, one TensorBoard run each."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from torch_sentinel.cli import main
from torch_sentinel.cli.demo_cases import CASES


def test_demo_prints_diagnoses_and_writes_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "demo"
    assert main(["demo", "--out", str(out_dir)]) == 0  # 0: every diagnosis is the lab's
    out, err = capsys.readouterr()
    lines = out.splitlines()
    expected = {
        "shape": "name_the_axes_and_fix_the_layer_contract",
        "dead_relu": "inspect_initialization_and_learning_rate",
        "no_update": "inspect_optimizer_update",
        "overfit": "investigate_generalization",
        "nonfinite": "inspect_forward_values",
        "healthy": "continue_training_or_collect_more_evidence",
    }
    assert [c.name for c in CASES] == list(expected)
    for name, diagnosis in expected.items():
        (i,) = [i for i, line in enumerate(lines) if re.match(rf"{name}\s+-> ", line)]
        assert lines[i].split("-> ")[1] == diagnosis
        assert lines[i + 1].lstrip().startswith("evidence: ")
        assert f"] {name}: bug: " in err  # progress, on stderr
    assert lines[-1] == f"  tensorboard --logdir {out_dir}"
    for name in expected:
        acc = EventAccumulator(str(out_dir / name), size_guidance={"scalars": 0})
        acc.Reload()
        if name == "shape":
            continue  # the first forward fails: no step completes, so no loss to log
        losses = acc.Scalars("loss/train")
        assert losses and all(e.value > 0 for e in losses)
    assert (
        "dead_fraction/act1"
        in EventAccumulator(str(out_dir / "dead_relu")).Reload().Tags()["scalars"]
    )
    assert (out_dir / "shape" / "findings.jsonl").read_text().count('"shape_mismatch"') == 1


def test_rerun_replaces_its_own_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for _ in range(2):
        assert main(["demo", "--out", str(tmp_path), "--only", "nonfinite"]) == 0
    capsys.readouterr()
    assert len(list((tmp_path / "nonfinite").glob("events.out.tfevents.*"))) == 1
    assert (tmp_path / "nonfinite" / "findings.jsonl").read_text().count('"non_finite"') == 1
