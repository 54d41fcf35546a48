"""Public bug reports, each as a buggy and a fixed program (``programs/``, sources in each
docstring): the buggy run is found with the right kind, localised where the bug has a place,
naming a cause its ground truth allows, within 20 optimizer steps of its onset; the fixed run is
quiet.

Programs that failed their first run (``FIRST_RUN.md``) are strict xfails with what happened, so
the suite passes now and a mechanism that starts finding one shows up as an XPASS.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from realbugs.harness import PROGRAMS, execute, judge, load

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: Buggy programs the first run (commit 9804e55) did not diagnose correctly: stem -> what happened.
FIRST_RUN_MISSES: dict[str, str] = {}

#: Fixed programs the first run reported a fault on: stem -> what was reported.
FIRST_RUN_FALSE_ALARMS: dict[str, str] = {}


def _params(known: dict[str, str]) -> list[Any]:
    return [pytest.param(p, id=p.stem, marks=pytest.mark.xfail(strict=True, reason=f"first run 9804e55: {known[p.stem]}"))
            if p.stem in known else pytest.param(p, id=p.stem) for p in PROGRAMS]


def test_the_corpus_has_forty_reports_of_twenty_five_classes() -> None:
    programs = [load(p) for p in PROGRAMS]
    assert len(programs) >= 40
    assert len({p.CLASS for p in programs}) >= 25


def test_every_xfail_names_a_program() -> None:
    stems = {p.stem for p in PROGRAMS}
    assert set(FIRST_RUN_MISSES) <= stems and set(FIRST_RUN_FALSE_ALARMS) <= stems


@pytest.mark.parametrize("path", _params(FIRST_RUN_MISSES))
def test_buggy_program_is_found_localised_and_early(path: pathlib.Path) -> None:
    program = load(path)
    assert program.__doc__ and "Source:" in program.__doc__ and program.SOURCE and program.CLASS
    verdict = judge(program, execute(program, bug=True))
    assert verdict.correct, verdict.problems


@pytest.mark.parametrize("path", _params(FIRST_RUN_FALSE_ALARMS))
def test_fixed_program_is_quiet(path: pathlib.Path) -> None:
    out = execute(load(path), bug=False)
    assert out.error is None, str(out.error)
    assert out.faults == [], [str(f) for f in out.faults]
