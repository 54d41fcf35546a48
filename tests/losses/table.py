"""Run every loss case once and print the table for FIRST_RUN.md (expected against got).

    cd <repo> && PYTHONPATH=$PWD OMP_NUM_THREADS=1 python tests/losses/table.py [--clause-optional]

``--clause-optional`` counts a finding of the expected kind as found even when it names no
clause (the code before the loss contracts named none).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent.parent))  # tests/, as pytest's pythonpath

from losses.cases import CASES
from losses.frameworks import FRAMEWORK_CASES
from losses.harness import Outcome, run, verdict


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clause-optional", action="store_true")
    ap.add_argument("--only", nargs="*", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for case in CASES:
        for form in case.forms:
            rows.append((case, form, lambda c=case, f=form: run(c, f)))
    for fc in FRAMEWORK_CASES:
        rows.append((fc, fc.form, fc.run))
    print("| case | form | loss | expected | got | ok |")
    print("|---|---|---|---|---|---|")
    totals = {"misuse": [0, 0], "healthy": [0, 0], "refused": [0, 0]}
    t0 = time.time()
    for case, form, go in rows:
        if a.only and case.name not in a.only:
            continue
        outcome: Outcome = go()
        ok = verdict(case, outcome, clause_required=not a.clause_optional)
        if case.raises is not None:
            expected, group = f"torch raises {case.raises.__name__}", "refused"
        elif case.expect is None:
            expected, group = "quiet", "healthy"
        else:
            expected, group = f"{case.expect[0]}/{case.expect[1]}", "misuse"
        totals[group][0] += ok
        totals[group][1] += 1
        print(f"| {case.name} | {form} | {case.loss} | {expected} | {outcome.got()} | {'yes' if ok else 'NO'} |")
        sys.stdout.flush()
    print()
    print(f"misuse found: {totals['misuse'][0]}/{totals['misuse'][1]}; healthy quiet: "
          f"{totals['healthy'][0]}/{totals['healthy'][1]}; refused by torch as expected: "
          f"{totals['refused'][0]}/{totals['refused'][1]} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
