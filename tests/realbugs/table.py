"""Print the realbugs detection table (markdown): ``PYTHONPATH=$PWD:$PWD/tests python tests/realbugs/table.py``."""

from __future__ import annotations

import sys

from realbugs.harness import PROGRAMS, execute, load


def main() -> None:
    print("| program | source | kind | onset | concluded | reported | localised / cause | fixed run |")
    print("|---|---|---|---|---|---|---|---|")
    for path in PROGRAMS:
        p = load(path)
        out = execute(p, bug=True)
        f = out.first(p.KIND)
        fixed = execute(p, bug=False)
        quiet = "quiet" if not fixed.faults and fixed.error is None else \
            "FALSE ALARM: " + ", ".join(g.kind for g in fixed.faults)
        if f is None:
            got = ", ".join(sorted({g.kind for g in out.findings})) or "nothing"
            print(f"| {path.stem} | {p.SOURCE.split(';')[0]} | MISSED ({got}) | {p.ONSET} | - | - | - | {quiet} |")
            continue
        nan = out.first("non_finite")
        if nan is not None:
            where = f"NaN at step {nan.step}, cause {nan.evidence.get('likely_cause')} (want {p.CAUSE})"
        elif p.MODULE is None:
            where = "no place (n/a)"
        else:
            where = f"{f.module!r} ({'yes' if f.module == p.MODULE else 'NO, want ' + repr(p.MODULE)})"
        print(f"| {path.stem} | {p.SOURCE.split(';')[0]} | {f.kind} | {p.ONSET} | {f.step} | "
              f"{out.reported_step(f)} | {where} | {quiet} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
