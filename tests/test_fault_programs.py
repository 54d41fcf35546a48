"""Every fault program in examples/faults reproduces its bug, and the sentinel names it."""

from __future__ import annotations

import logging
import math
import pathlib
import warnings

import pytest
from helpers import EXAMPLES, load_program

import torch_sentinel

FAULTS = sorted((EXAMPLES / "faults").glob("*.py"))




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


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_there_are_at_least_twenty_fault_programs() -> None:
    assert len(FAULTS) >= 20


@pytest.mark.parametrize("path", FAULTS, ids=[p.stem for p in FAULTS])
def test_fault_program_is_detected(path: pathlib.Path, tmp_path: pathlib.Path) -> None:
    program = load_program(path, "fault")
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
