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
#: The analysis of each is in FIRST_RUN.md.
FIRST_RUN_MISSES: dict[str, str] = {
    "box_target_log_of_zero_height": "non_finite at step 15 named likely cause 'learning_rate' "
                                     "(from 2.bias's update ratio 0.14), want 'data' (a -inf target)",
    "dataset_labels_misaligned_with_images": "nothing reported: loss at chance ln 2, but noise dips "
                                             "of 6% pass plateau's 3% improvement test",
    "nll_loss_on_softmax_probabilities": "reported as probabilities_as_logits ('nll_loss expects logits'), "
                                         "invalid_loss_input not found",
    "sigmoid_output_with_default_bce_with_logits": "probabilities_as_logits named '' (the squeezed root output), "
                                                   "not the Sigmoid at 'output.1'",
    "step_lr_stepped_per_batch": "update_ratio 'too low' concluded at step 50, reported at 59; onset 14",
}

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
