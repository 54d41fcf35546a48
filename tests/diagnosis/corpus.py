"""The issue-25 diagnosis cases (``cases/``): the classes of issue 25 that neither the realbugs
corpus nor the healthy corpus covers, each a small real training program.

A case module has the realbugs fields (``SOURCE``, ``CLASS``, ``KIND``, ``MODULE``, ``CAUSE``,
``ONSET``, optionally ``NEXT_CHECK`` and ``contradicts``) and ``run(bug, watch)``. ``KIND = None``
marks a healthy-only case: ``run(False, watch)`` is a healthy program that must produce no
warning or error; ``INFO = (kind, module)``, where given, is an info finding it should carry
(a parameter without a gradient by construction, named with its reason). A faulty case is judged
like a realbugs program (``realbugs.harness.judge``) and its fixed run must be quiet.

Print the table: ``PYTHONPATH=$PWD:$PWD/tests python tests/diagnosis/corpus.py [case ...]``.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from types import ModuleType
from typing import Optional

from realbugs.harness import Outcome, execute, judge, load

CASES = sorted(p for p in (pathlib.Path(__file__).parent / "cases").glob("*.py") if not p.name.startswith("_"))


@dataclasses.dataclass
class CaseResult:
    """What one case's runs showed, judged against its expectation."""

    name: str
    case: ModuleType
    #: the buggy run (None for a healthy-only case)
    buggy: Optional[Outcome]
    #: the healthy or fixed run
    healthy: Outcome
    #: why the case is not diagnosed as expected (empty: correct)
    problems: list[str]

    @property
    def correct(self) -> bool:
        return not self.problems


def info_problem(case: ModuleType, out: Outcome) -> Optional[str]:
    """An expected info finding that is missing (or not info)."""
    want = getattr(case, "INFO", None)
    if want is None:
        return None
    kind, module = want
    hits = [f for f in out.findings if f.kind == kind and f.module == module]
    if not hits:
        return f"info {kind}@{module!r} not found"
    if hits[0].severity != "info":
        return f"{kind}@{module!r} is a {hits[0].severity}, want info"
    return None


def quiet_problem(out: Outcome) -> Optional[str]:
    alarms = [f"{f.kind}@{f.module!r} s{f.step}" for f in out.faults]
    if out.error is not None:
        alarms.append("NonFiniteError")
    return "FALSE ALARM: " + ", ".join(alarms) if alarms else None


def run_case(path: pathlib.Path) -> CaseResult:
    case = load(path)
    problems: list[str] = []
    buggy = None
    if case.KIND is not None:
        buggy = execute(case, bug=True)
        problems += judge(case, buggy).problems
    healthy = execute(case, bug=False)
    for problem in (quiet_problem(healthy), info_problem(case, healthy)):
        if problem:
            problems.append(problem)
    return CaseResult(path.stem, case, buggy, healthy, problems)


def _found(out: Optional[Outcome], kind: Optional[str]) -> str:
    if out is None or kind is None:
        return "-"
    f = out.first(kind)
    if f is None:
        faults = ", ".join(f"{g.kind}@{g.module!r} s{g.step}" for g in out.faults[:3]) or "nothing"
        return f"MISSED ({faults})"
    return f"{f.kind}@{f.module!r}: {f.step} / {out.reported_step(f)}"


def main(names: Optional[list[str]] = None) -> None:
    print("| case | class | expected | onset | buggy run (kind@module: concluded / reported step) "
          "| healthy or fixed run | verdict |")
    print("|---|---|---|---|---|---|---|")
    correct = total = 0
    for path in CASES:
        if names and path.stem not in names:
            continue
        r = run_case(path)
        c = r.case
        expected = "quiet" if c.KIND is None else c.KIND + (f" @{c.MODULE!r}" if c.MODULE is not None else "")
        if getattr(c, "INFO", None):
            expected += f" (+ info {c.INFO[0]} @{c.INFO[1]!r})"
        quiet = quiet_problem(r.healthy) or "quiet"
        info = info_problem(c, r.healthy)
        if info:
            quiet += f"; {info}"
        verdict = "correct" if r.correct else "; ".join(r.problems)[:200]
        total += 1
        correct += r.correct
        print(f"| {r.name} | {c.CLASS} | {expected} | {c.ONSET if c.KIND else '-'} | {_found(r.buggy, c.KIND)} "
              f"| {quiet} | {verdict} |")
        sys.stdout.flush()
    print()
    print(f"{correct} / {total} cases correct")


if __name__ == "__main__":
    main(sys.argv[1:] or None)
