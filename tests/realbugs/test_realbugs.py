"""Public bug reports, each as a buggy and a fixed program (``programs/``, sources in each
docstring): the buggy run is found with the right kind, localised where the bug has a place,
within 20 optimizer steps of its onset; the fixed run is quiet."""

from __future__ import annotations

import pathlib

import pytest
from realbugs.harness import PROGRAMS, execute, load

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: At default settings a fault present from its onset is reported within this many steps.
LATENCY = 20


def test_there_are_at_least_twelve_bug_reports() -> None:
    assert len(PROGRAMS) >= 12


@pytest.mark.parametrize("path", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_buggy_program_is_found_localised_and_early(path: pathlib.Path) -> None:
    program = load(path)
    assert program.__doc__ and "Source:" in program.__doc__ and program.SOURCE
    out = execute(program, bug=True)
    f = out.first(program.KIND)
    assert f is not None, f"{program.KIND} not found; got {[(g.kind, g.module, g.step) for g in out.findings]}"
    if program.MODULE is not None:
        assert f.module == program.MODULE, (f.module, f.message)
    nan = out.first("non_finite")
    if program.CAUSE is not None and nan is not None:  # the NaN, if it came, names the cause first
        assert nan.evidence.get("likely_cause") == program.CAUSE, nan.evidence.get("likely_causes")
    reported = out.reported_step(f)
    assert reported is not None and reported - program.ONSET <= LATENCY, (reported, program.ONSET)
    assert f.onset_step is not None and f.onset_step <= reported


@pytest.mark.parametrize("path", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_fixed_program_is_quiet(path: pathlib.Path) -> None:
    out = execute(load(path), bug=False)
    assert out.error is None, str(out.error)
    assert out.faults == [], [str(f) for f in out.faults]
