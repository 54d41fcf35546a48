"""Every fault program in examples/faults reproduces its bug, and the sentinel names it."""

from __future__ import annotations

import importlib.util
import logging
import math
import pathlib
import warnings
from types import ModuleType

import pytest
import torch

import torch_sentinel

FAULTS = sorted((pathlib.Path(__file__).parent.parent / "examples" / "faults").glob("*.py"))


def load(path: pathlib.Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"fault_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _numbers(value: object):
    """Every plain number in a finding's evidence (fractions, norms, ratios, steps)."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield float(value)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)
    elif isinstance(value, list):
        for v in value:
            yield from _numbers(v)


@pytest.fixture(autouse=True)
def _one_thread():
    # 2 shared cores: intra-op threads only thrash here.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_there_are_at_least_twenty_fault_programs() -> None:
    assert len(FAULTS) >= 20


@pytest.mark.parametrize("path", FAULTS, ids=[p.stem for p in FAULTS])
def test_fault_program_is_detected(path: pathlib.Path, tmp_path: pathlib.Path) -> None:
    program = load(path)
    assert program.__doc__ and "Source pattern" in program.__doc__, "name the real-world pattern"
    expected = program.EXPECTED
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            report = program.run(log_dir=str(tmp_path))
        finally:
            logging.disable(logging.NOTSET)
    assert isinstance(report, torch_sentinel.Report)
    hits = report.by_kind(expected["kind"])
    assert hits, f"{expected['kind']} not found; got {[(f.kind, f.module) for f in report.findings]}"
    f = hits[0]
    assert (f.boundary, f.module) == (expected["boundary"], expected["module"])
    assert f.is_fault and f.step is not None and f.next_check
    numbers = list(_numbers(f.evidence))
    assert numbers and all(math.isfinite(v) for v in numbers), f.evidence
    assert not report.ok and report.boundary is not None
    text = str(report)
    for field in ("symptom:", "evidence:", "hypothesis:", "next check:"):
        assert field in text
