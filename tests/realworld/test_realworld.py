"""The real-world corpus: programs modelled on public training code, healthy and with one-line bugs.

Every healthy run must be quiet and raise nothing, and still learn; every injected bug must be
found with the kind that names its cause (and ``NonFiniteError`` where the run really goes
non-finite), localised to the module where the bug has a place. Cases the detectors get wrong
today are strict xfails whose reason says what is missing (see each program's ``BUGS``).

With ``REALWORLD_TABLE=<path>`` set, each case appends one JSON line (program, bug, expected and
found kind, module, reported step, onset) to that file: the detection table in the notes.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Iterator
from typing import Any, Optional

import pytest
from realworld.harness import MAX_LATENCY, Outcome, execute, load, program_names

from torch_sentinel import NonFiniteError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROGRAMS = program_names()
#: one run per variant, shared by the detection and the latency test (each run costs ~0.5 s)
_OUTCOMES: dict[tuple[str, Optional[str]], Outcome] = {}


def _outcome(name: str, bug: Optional[str], factory: pytest.TempPathFactory) -> Outcome:
    key = (name, bug)
    if key not in _OUTCOMES:
        _OUTCOMES[key] = execute(load(name), bug, factory.mktemp(f"{name}-{bug}"))
    return _OUTCOMES[key]


def _healthy_params() -> list[Any]:
    return list(_healthy())


def _bugs_params() -> list[Any]:
    return list(_bugs())


def _healthy() -> Iterator[Any]:
    for name in PROGRAMS:
        reason = load(name).HEALTHY_XFAIL
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        yield pytest.param(name, id=name, marks=marks)


def _bugs() -> Iterator[Any]:
    for name in PROGRAMS:
        for bug, spec in load(name).BUGS.items():
            marks = [pytest.mark.xfail(strict=True, reason=spec.xfail)] if spec.xfail else []
            yield pytest.param(name, bug, id=f"{name}-{bug}", marks=marks)


def _latency_params() -> list[Any]:
    params = []
    for name in PROGRAMS:
        for bug, spec in load(name).BUGS.items():
            reason = spec.late or (spec.xfail and f"detection: {spec.xfail}")
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            params.append(pytest.param(name, bug, id=f"{name}-{bug}", marks=marks))
    return params


def _record(name: str, bug: Optional[str], outcome: Outcome, expected: Any, found: Any) -> None:
    path = os.environ.get("REALWORLD_TABLE")
    if not path:
        return
    row = {"program": name, "modelled_on": load(name).MODELLED_ON, "bug": bug,
           "expected": expected, "error": type(outcome.error).__name__ if outcome.error else None,
           "findings": [{"kind": f.kind, "module": f.module, "step": f.step,
                         "onset": getattr(f, "onset_step", None)}
                        for f in outcome.findings],
           "found": found}
    with open(path, "a") as fh:
        fh.write(json.dumps(row) + "\n")


def test_corpus_has_ten_programs_with_two_bugs_each() -> None:
    assert len(PROGRAMS) >= 10
    for name in PROGRAMS:
        program = load(name)
        assert program.__doc__ and "Modelled on:" in program.__doc__, name
        assert len(program.BUGS) >= 2, name


@pytest.mark.parametrize("name", _healthy_params())
def test_healthy_program_is_quiet_and_learns(name: str, tmp_path: pathlib.Path) -> None:
    program = load(name)
    outcome = execute(program, None, tmp_path)
    _record(name, None, outcome, None, [f.kind for f in outcome.faults])
    assert outcome.error is None, repr(outcome.error)
    assert [str(f) for f in outcome.faults] == []
    if getattr(program, "ADVERSARIAL", False):
        return  # a GAN's losses oscillate by design; quiet is the whole requirement
    losses = outcome.losses
    assert len(losses) >= 20
    tail = sum(losses[-5:]) / 5
    assert tail < 0.8 * losses[0], f"did not learn: {losses[0]:.3f} -> {tail:.3f}"


@pytest.mark.parametrize(("name", "bug"), _bugs_params())
def test_injected_bug_is_found_and_localised(name: str, bug: str,
                                             tmp_path_factory: pytest.TempPathFactory) -> None:
    spec = load(name).BUGS[bug]
    outcome = _outcome(name, bug, tmp_path_factory)
    hit = outcome.first(spec.kinds)
    _record(name, bug, outcome, {"kind": spec.kinds, "module": spec.module},
            None if hit is None else {"kind": hit.kind, "module": hit.module, "step": hit.step,
                                      "onset": getattr(hit, "onset_step", None)})
    if spec.nonfinite:
        assert isinstance(outcome.error, NonFiniteError), repr(outcome.error)
    else:
        assert outcome.error is None, repr(outcome.error)
    assert hit is not None, f"expected {spec.kinds}; found {outcome.summary()}"
    assert hit.step is not None
    if spec.module is not None:
        assert outcome.localised(hit.module, spec.module), (
            f"localised to {hit.module!r}, expected {spec.module!r}; found {outcome.summary()}")


@pytest.mark.parametrize(("name", "bug"), _latency_params())
def test_injected_bug_is_reported_within_twenty_steps_of_its_onset(
        name: str, bug: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Issue 12: at default settings a fault is reported within 20 optimizer steps of its onset."""
    spec = load(name).BUGS[bug]
    hit = _outcome(name, bug, tmp_path_factory).first(spec.kinds)
    assert hit is not None and hit.step is not None
    assert hit.step - spec.onset <= MAX_LATENCY, (
        f"{hit.kind} reported at step {hit.step}, {hit.step - spec.onset} steps after the fault's "
        f"onset at step {spec.onset}")
