"""Print the realbugs detection table and its totals (markdown):
``PYTHONPATH=$PWD:$PWD/tests python tests/realbugs/table.py [program-stem ...]``.

One row per program: the class and source, the expected finding and its onset, what the sentinel
reported on the buggy run (kind, the step it concluded on, the step the user saw it), whether it
named the right module and cause, and whether the fixed run stayed quiet. The totals count the
first corpus (issue 21) and the programs added for issue 25 apart.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Optional

from realbugs.harness import FIRST_CORPUS, PROGRAMS, Outcome, execute, judge, load


def _mark(ok: Optional[bool], what: str = "") -> str:
    if ok is None:
        return "n/a"
    return ("yes" if ok else "NO") + (f" {what}" if what else "")


def _reported(out: Outcome) -> str:
    faults = [f for f in out.findings if f.is_fault]
    if not faults:
        return "nothing"
    return ", ".join(f"{f.kind}{'@' + repr(f.module) if f.module else ''} s{f.step}" for f in faults[:4]) + (
        ", ..." if len(faults) > 4 else "")


@dataclasses.dataclass
class Tally:
    programs: int = 0
    kind_found: int = 0
    in_time: int = 0
    module_right: int = 0
    module_cases: int = 0
    cause_right: int = 0
    cause_cases: int = 0
    correct: int = 0
    false_alarms: int = 0

    def line(self, name: str) -> str:
        return (f"| {name} | {self.programs} | {self.kind_found} | {self.in_time} | "
                f"{self.module_right}/{self.module_cases} | {self.cause_right}/{self.cause_cases} | "
                f"{self.correct} | {self.false_alarms} |")


def main(names: Optional[list[str]] = None) -> None:
    tallies = {"first corpus (issue 21)": Tally(), "added for issue 25": Tally()}
    print("| program | class | source | expected kind | onset | reported (kind: concluded / reported step) "
          "| module / cause right? | verdict | fixed run |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in PROGRAMS:
        if names and path.stem not in names:
            continue
        p = load(path)
        out = execute(p, bug=True)
        v = judge(p, out)
        fixed = execute(p, bug=False)
        alarms = [g.kind for g in fixed.faults] + (["NonFiniteError"] if fixed.error is not None else [])
        quiet = "quiet" if not alarms else "FALSE ALARM: " + ", ".join(sorted(set(alarms)))
        t = tallies["first corpus (issue 21)" if path.stem in FIRST_CORPUS else "added for issue 25"]
        t.programs += 1
        t.false_alarms += bool(alarms)
        expected = p.KIND + (f" @{p.MODULE!r}" if p.MODULE is not None else "")
        if v.finding is None:
            got = f"MISSED ({_reported(out)})"
            where = "-"
        else:
            t.kind_found += 1
            t.in_time += not any(pr.startswith("reported at step") for pr in v.problems)
            got = f"{v.finding.kind}: {v.finding.step} / {v.reported}"
            module = _mark(v.module_right, repr(v.finding.module) if v.module_right is False else "")
            nan = out.first("non_finite")
            cause_text = ""
            if v.cause_right is False:
                if nan is not None and p.CAUSE and nan.evidence.get("likely_cause") != p.CAUSE:
                    cause_text = repr(nan.evidence.get("likely_cause"))
                elif getattr(p, "NEXT_CHECK", None) not in (None, v.finding.next_check):
                    cause_text = repr(v.finding.next_check)
                else:
                    cause_text = "(its message contradicts the run)"
            where = f"module {module}; cause {_mark(v.cause_right, cause_text)}"
            if v.module_right is not None:
                t.module_cases += 1
                t.module_right += bool(v.module_right)
            if v.cause_right is not None:
                t.cause_cases += 1
                t.cause_right += bool(v.cause_right)
        t.correct += v.correct
        verdict = "correct" if v.correct else "; ".join(v.problems)[:160]
        print(f"| {path.stem} | {p.CLASS} | {p.SOURCE.split(';')[0].strip()} | {expected} | {p.ONSET} | {got} "
              f"| {where} | {verdict} | {quiet} |")
        sys.stdout.flush()
    print()
    print("| corpus | programs | expected kind found | ... within 20 steps | module right | cause right "
          "| fully correct | false alarms on fixed runs |")
    print("|---|---|---|---|---|---|---|---|")
    for name, t in tallies.items():
        print(t.line(name))
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:] or None)
