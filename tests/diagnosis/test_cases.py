"""The issue-25 diagnosis cases (``cases/``, driven by ``corpus.py``): each healthy case is quiet
(and carries its expected info finding), each faulty case is found with the right kind, module
and cause within 20 steps, and its fixed run is quiet.

Cases the first run (``FIRST_RUN.md``) did not get right are strict xfails stating what happened,
so a mechanism that fixes one shows up as an XPASS.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from diagnosis.corpus import CASES, run_case

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: Cases the first run (commit 65b1ca1, detectors unchanged) did not get right: stem -> what happened.
FIRST_RUN_WRONG: dict[str, str] = {
}


def _params() -> list[Any]:
    return [pytest.param(p, id=p.stem, marks=pytest.mark.xfail(strict=True, reason=f"first run: {FIRST_RUN_WRONG[p.stem]}"))
            if p.stem in FIRST_RUN_WRONG else pytest.param(p, id=p.stem) for p in CASES]


def test_every_xfail_names_a_case() -> None:
    assert set(FIRST_RUN_WRONG) <= {p.stem for p in CASES}


@pytest.mark.parametrize("path", _params())
def test_case_is_diagnosed_as_expected(path: pathlib.Path) -> None:
    case = run_case(path)
    assert case.case.__doc__ and "Source:" in case.case.__doc__ and case.case.SOURCE and case.case.CLASS
    assert case.correct, case.problems
