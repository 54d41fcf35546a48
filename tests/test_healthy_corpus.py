"""Healthy training programs produce no fault findings: a detector that cries wolf is turned off."""

from __future__ import annotations

import pathlib

import pytest
import torch
from helpers import EXAMPLES, load_program

import torch_sentinel
from torch_sentinel._options import ENV_CHECK
from torch_sentinel.diagnosis.ladder import HEALTHY_NEXT_CHECK

HEALTHY = sorted((EXAMPLES / "healthy").glob("*.py"))
REQUIRED = {"mlp_validation", "cnn_batchnorm_dropout", "transformer_warmup", "gradient_accumulation",
            "frozen_backbone_finetune", "amp_scaler_skips", "eval_passes_no_grad", "sparse_relu"}




pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_corpus_covers_the_required_programs() -> None:
    assert {p.stem for p in HEALTHY} >= REQUIRED


@pytest.mark.parametrize("path", HEALTHY, ids=[p.stem for p in HEALTHY])
def test_healthy_program_is_quiet(path: pathlib.Path) -> None:
    program = load_program(path, "healthy")
    assert program.EXPECTED is None
    report = program.run()
    assert isinstance(report, torch_sentinel.Report)
    faults = [str(f) for f in report.findings if f.is_fault]
    assert faults == []
    assert report.ok and report.boundary is None
    assert report.next_check == HEALTHY_NEXT_CHECK
    assert report.steps >= 20


#: Past step 100 the sentinel samples less (``_collect/cadence.py``, ``dead_relu.every``) and the
#: curve detectors have seen long stretches: a long run of every healthy program stays quiet too.
LONG_STEPS = 300


@pytest.mark.parametrize("check", ["immediate", "deferred"], ids=["immediate", "deferred"])
@pytest.mark.parametrize("path", HEALTHY, ids=[p.stem for p in HEALTHY])
def test_healthy_program_stays_quiet_over_a_long_run(path: pathlib.Path, check: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Both check modes: deferred is the default on accelerators (every module hooked, every step)."""
    monkeypatch.setenv(ENV_CHECK, check)
    with torch_sentinel.attach(torch.nn.Linear(2, 2)) as probe:
        assert probe.check_mode == check  # the programs' own attach() reads the same variable
    report = load_program(path, "healthy").run(steps=LONG_STEPS)
    assert [str(f) for f in report.findings if f.is_fault] == []
    assert report.steps == LONG_STEPS
