"""``python -m benchmarks.precision``: run every part, print the tables, write the results."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from typing import Any, Optional

import torch

from . import device_cost, estimate, exactness, overhead, prediction

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")


def to_markdown(results: dict[str, Any]) -> str:
    lines = [f"Measured {results['date']} on {results['machine']}, torch {results['torch']}, "
             f"{results['threads']} thread(s); `python -m benchmarks.precision`.", ""]
    lines += ["**Exactness** against `x.to(dtype)` (largest |histogram - cast| over the tensors; "
              "in brackets, how many tensors had a nonzero fraction):", "",
              "| format | tensors | elements | flushed | subnormal | saturated |", "|---|---|---|---|---|---|"]
    for name, r in results["exactness"].items():
        err, nz = r["max_error"], r["tensors_with_nonzero"]
        lines.append(f"| {name} | {r['tensors']} | {r['elements']:,} | "
                     + " | ".join(f"{err[k]:.1g} ({nz[k]})" for k in ("flushed", "subnormal", "saturated")) + " |")
    lines += ["", "**Underflow estimate** for tensors already rounded to fp16 (`derive.flushed_share`, "
              "from the values at the smallest subnormal) against the true share of nonzero values that flush:",
              "", "| distribution | scale | true | estimate |", "|---|---|---|---|"]
    for r in results["estimate"]:
        lines.append(f"| {r['distribution']} | 2^{r['scale_log2']} | {r['true']:.3f} | {r['estimate']:.3f} |")
    p = results["prediction"]
    lines += ["", f"**Prediction** of an fp16 overflow, activations growing x1.1 a step: {p['hits']} of "
              f"{p['of']} runs hit (concluded >= 10 steps ahead, predicted step within +-2):", "",
              "| run | overflowed at | concluded at | reported at | predicted | lead (steps) | error (steps) | hit |",
              "|---|---|---|---|---|---|---|---|"]
    for r in p["runs"]:
        cells = [str(r["seed"]), str(r["actual"])] + [str(r.get(k, "-")) for k in ("concluded", "reported", "predicted", "lead")]
        error = r.get("error")
        cells += ["-" if error is None else f"{error:+d}", "yes" if r["hit"] else "no"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "**Overhead** of watching all four formats (`precision=('bf16', 'fp16', 'e4m3', 'e5m2')`) "
              "against the same sentinel with `precision=()`, total time over the phase, steps interleaved:", "",
              "| model | phase | steps (sampled, with histograms) | bare ms/step | precision / sentinel | sentinel / bare | "
              "sentinel+precision / bare | extra ms per histogram step |", "|---|---|---|---|---|---|---|---|"]
    for r in results["overhead"]:
        for phase, label in (("first", "steps 0-99"), ("steady", "steady state")):
            e = r[phase]
            extra = "-" if e["sampled_step_extra_ms"] is None else f"{e['sampled_step_extra_ms']:.1f}"
            lines.append(f"| {r['model']} | {label} | {e['steps']} ({e['sampled_steps']}, {e.get('histogram_steps', '-')}) | {e['bare_ms']:.1f} | "
                         f"{e['precision_vs_sentinel']:.3f} | {e['sentinel_vs_bare']:.3f} | "
                         f"{e['precision_vs_bare']:.3f} | {extra} |")
    lines += ["", "The two phases differ in how often a step is sampled, not in what a sample costs (the last "
              "column): the first 100 steps sample all of steps 0-9 and then every tenth (19 steps; "
              "`_collect/cadence.py`, the schedule every sampling probe shares), the steady state one step in 50. "
              "Of the first 19, steps 3-9 take only each tensor's amax, for the overflow trend "
              "(`precision/probe.py`, `histogram_step`): 12 take histograms. The first phase's ratio is the one a "
              "short run pays; a long run's average tends to the steady state's."]
    d = results["device_cost"]
    lines += ["", f"**Device cost** of one tensor ({d['numel']:,} float32 elements, one CPU thread, median of "
              "interleaved rounds):", "", "| what | ns per element |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in d["ns_per_element"].items()]
    h = results["host_reads"]
    lines += ["", f"**Host reads** (`count_host_syncs`, steps 0-11 and 100-101 of the {h['model']}, no flush): "
              + "; ".join(f"{check}: bare {c['bare']}, sentinel {c['sentinel']}, with precision "
                          f"{c['sentinel+precision']} (added: {c['sentinel+precision'] - c['sentinel']})"
                          for check, c in h["counts"].items()) + "."]
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.precision", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run: fewer tensors, runs, steps; tiny models")
    parser.add_argument("--models", default="mlp,cnn,transformer", help="overhead models (benchmarks/models.py)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    quick = args.quick
    t0 = time.time()
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "torch": torch.__version__, "threads": args.threads, "quick": quick,
    }
    results["exactness"] = exactness.run(50 if quick else 1000)
    print("exactness:", {k: v["max_error"] for k, v in results["exactness"].items()}, file=sys.stderr)
    results["estimate"] = estimate.run(10_000 if quick else 100_000)
    results["prediction"] = prediction.run(3 if quick else 10)
    print(f"prediction: {results['prediction']['hits']} of {results['prediction']['of']}", file=sys.stderr)
    results["device_cost"] = device_cost.run(1 << 16 if quick else 1 << 20)
    results["overhead"] = []
    for name in args.models.split(","):
        steady = {"transformer": 100}.get(name, 200)
        r = overhead.run(name, first=100, steady=20 if quick else steady, tiny=quick)
        results["overhead"].append(r)
        print(f"overhead {name}: {r['steady']['precision_vs_sentinel']:.3f} steady", file=sys.stderr)
    results["host_reads"] = {"model": "MLP" + (" (tiny)" if quick else ""), "counts": overhead.host_reads("mlp", quick)}
    results["seconds"] = time.time() - t0
    table = to_markdown(results)
    print(table)
    if not quick:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "precision-cpu.json"), "w") as fh:
            json.dump(results, fh, indent=1)
        with open(os.path.join(args.out, "precision-cpu.md"), "w") as fh:
            fh.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
