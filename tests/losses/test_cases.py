"""Every loss case, healthy and misused, trained with the one-line attach (see cases.py).

A misuse must be named with its kind and clause; a healthy call must leave the run quiet; a
misuse torch refuses by itself must still raise (so the table's "silent" column stays true).
"""

from __future__ import annotations

import pytest
from losses.cases import Case
from losses.frameworks import FRAMEWORK_CASES, FrameworkCase
from losses.harness import case_id, params, run, verdict

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PARAMS = [
    pytest.param(case, form, id=case_id(case, form),
                 marks=[pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else [])
    for case, form in params()
]


@pytest.mark.parametrize(("case", "form"), PARAMS)
def test_case(case: Case, form: str) -> None:
    outcome = run(case, form)
    assert verdict(case, outcome), f"expected {case.expect or ('raise ' + case.raises.__name__ if case.raises else 'quiet')}, got {outcome.got()}"


@pytest.mark.parametrize("case", FRAMEWORK_CASES, ids=[f"{c.name}[{c.form}]" for c in FRAMEWORK_CASES])
def test_framework_case(case: FrameworkCase) -> None:
    outcome = case.run()
    assert verdict(case, outcome), f"expected {case.expect or 'quiet'}, got {outcome.got()}"
