"""Healthy training programs produce no fault findings: a detector that cries wolf is turned off."""

from __future__ import annotations

import importlib.util
import pathlib
from types import ModuleType

import pytest
import torch

import torch_sentinel
from torch_sentinel.diagnosis.ladder import HEALTHY_NEXT_CHECK

HEALTHY = sorted((pathlib.Path(__file__).parent.parent / "examples" / "healthy").glob("*.py"))
REQUIRED = {"mlp_validation", "cnn_batchnorm_dropout", "transformer_warmup", "gradient_accumulation",
            "frozen_backbone_finetune", "amp_scaler_skips", "eval_passes_no_grad", "sparse_relu"}


def load(path: pathlib.Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"healthy_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_corpus_covers_the_required_programs() -> None:
    assert {p.stem for p in HEALTHY} >= REQUIRED


@pytest.mark.parametrize("path", HEALTHY, ids=[p.stem for p in HEALTHY])
def test_healthy_program_is_quiet(path: pathlib.Path) -> None:
    program = load(path)
    assert program.EXPECTED is None
    report = program.run()
    assert isinstance(report, torch_sentinel.Report)
    faults = [str(f) for f in report.findings if f.is_fault]
    assert faults == []
    assert report.ok and report.boundary is None
    assert report.next_check == HEALTHY_NEXT_CHECK
    assert report.steps >= 20
