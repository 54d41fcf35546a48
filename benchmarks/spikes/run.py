"""The loss-spike benchmark: the sentinel, attached to every run, beside four published detectors
replayed on the same loss traces.

    python -m benchmarks.spikes.run --split heldout     # the published figures
    python -m benchmarks.spikes.run --split tune        # the split the forensics were tuned on
    python -m benchmarks.spikes.run --split fresh       # cases written for a later change

Each run of the split (``plan.py``) trains with ``torch_sentinel.attach`` on the model; its loss
trace and ``loss_spike`` findings are kept (``cache/<split>-sentinel.pkl``), and the table is
written to ``results/spikes-<split>.md`` and ``.json``.

What is counted:

- **detected**: a spike flagged in the 40 steps from the injection on.
- **false spikes per 10,000 clean steps**: flags on the clean runs and on the injected runs
  before their injection (every step of a run counts, warm-up included: a detector that waits
  cannot flag).
- **first mover top-1 (within 2 steps)**: the finding's ``module`` is the injected module or a
  module inside it, and ``lead_steps`` is within 2 of the true lead (spike step minus injection
  step). A bad batch has no module: its row says n/a.
- **cause**: ``evidence["cause"]`` is the injected cause.

The four baselines only detect; they cannot name a layer (n/a).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from .baselines import BASELINES
from .injections import CAUSES
from .plan import CACHE, runs_for
from .train import Run, run

RESULTS = os.path.join(os.path.dirname(__file__), "..", "results")
WINDOW = 40


class SpikeCounter:
    """A sink that keeps the ``loss_spike`` detector's running spike count at each flush (the
    findings list keeps one finding per kind and module; the count sees every spike)."""

    def __init__(self) -> None:
        self.counts: list[tuple[int, int]] = []

    def write(self, records: Sequence[Any], findings: Sequence[Any]) -> None:
        return None

    def write_stats(self, step: int, stats: dict[str, float]) -> None:
        if "detector/loss_spike/spikes" in stats:
            self.counts.append((step, int(stats["detector/loss_spike/spikes"])))

    def close(self) -> None:
        return None

    def before(self, step: int) -> int:
        """Spikes found at flushes before ``step``."""
        return max((c for s, c in self.counts if s < step), default=0)

    def total(self) -> int:
        return max((c for _, c in self.counts), default=0)


def run_split(split: str, refresh: bool = False) -> list[dict[str, Any]]:
    path = os.path.join(CACHE, f"{split}-sentinel.pkl")
    done: dict[str, dict[str, Any]] = {}
    if os.path.exists(path) and not refresh:
        with open(path, "rb") as fh:
            done = pickle.load(fh)
    for spec in runs_for(split):
        if spec.name in done:
            continue
        counter = SpikeCounter()
        trace = run(spec, watch="sentinel", sinks=[counter])
        done[spec.name] = {"run": spec, "loss": trace.loss, "findings": trace.findings,
                           "counts": counter.counts, "seconds": trace.seconds, "stopped_at": trace.stopped_at}
        with open(path, "wb") as fh:
            pickle.dump(done, fh)
        print(f"{split} {spec.name}: {trace.seconds:.0f} s", flush=True)
    return list(done.values())


def inside(named: Optional[str], target: Optional[str]) -> bool:
    if named is None or target is None:
        return False
    base = named.split("[")[0]
    return base == target or base.startswith(target + ".") or target == ""


def _as_spike(error: dict[str, Any]) -> dict[str, Any]:
    """A ``non_finite`` finding read as the benchmark reads a ``loss_spike`` one."""
    ev = error.get("evidence", {})
    moved = [c for c in ev.get("likely_causes", []) if c.get("cause") == "weights_changed"]
    if ev.get("likely_cause") == "weights_changed" and moved:
        weight = moved[0]["evidence"]["weights"][0]["parameter"]
        return {**error, "module": weight.rpartition(".")[0],
                "evidence": {"cause": "corrupted_weight", "lead_steps": 0}}
    return {**error, "evidence": {"cause": "non_finite", "lead_steps": 0}}


def score(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per cause and overall: detection for every detector, attribution for the sentinel."""
    detectors = ["sentinel", *BASELINES]
    per_cause: dict[str, dict[str, Any]] = {c: {"n": 0, **{d: 0 for d in detectors}, "mover": 0, "mover_n": 0,
                                               "cause": 0, "latency": []} for c in CAUSES}
    clean_steps = 0
    false = {d: 0 for d in detectors}
    details = []
    result_stopped: list[str] = []
    for row in rows:
        spec: Run = row["run"]
        loss = row["loss"]
        inj = spec.injection
        end = inj.t0 if inj else len(loss)
        clean_steps += end
        counter = SpikeCounter()
        counter.counts = row["counts"]
        false["sentinel"] += counter.before(end) if inj else counter.total()
        flags = {name: fn(loss) for name, fn in BASELINES.items()}
        for name, steps in flags.items():
            false[name] += sum(1 for s in steps if s < end)
        if inj is None:
            continue
        c = per_cause[inj.cause]
        c["n"] += 1
        for name, steps in flags.items():
            c[name] += any(inj.t0 <= s < inj.t0 + WINDOW for s in steps)
        spikes = [f for f in row["findings"] if f["kind"] == "loss_spike" and inj.t0 <= f["step"] < inj.t0 + WINDOW]
        stopped = row.get("stopped_at")
        if not spikes and stopped is not None and inj.t0 <= stopped < inj.t0 + WINDOW:
            # The sentinel raised NonFiniteError and the run stopped there: found at the step the
            # error names. Its cause counts as right only when the error named a weight rewritten
            # between steps (``weights_changed``), and that weight's module is then the mover;
            # else the error's module, with cause ``non_finite`` (wrong).
            spikes = [_as_spike(f) for f in row["findings"] if f["kind"] == "non_finite"][:1]
            result_stopped.append(spec.name)
        detail = {"run": spec.name, "injection": inj.describe(), "detected": bool(spikes),
                  "stopped_at": stopped}
        if spikes:
            f = min(spikes, key=lambda f: f["step"])
            ev = f["evidence"]
            c["sentinel"] += 1
            c["latency"].append(f["step"] - inj.t0)
            cause_ok = ev.get("cause") == inj.cause
            c["cause"] += cause_ok
            true_lead = f["step"] - inj.t0
            detail.update(spike_step=f["step"], cause=ev.get("cause"), first_mover=f["module"],
                          lead_steps=ev.get("lead_steps"), true_lead=true_lead, cause_ok=cause_ok)
            if inj.module is not None:
                c["mover_n"] += 1
                lead = ev.get("lead_steps")
                ok = inside(f["module"], inj.module) and lead is not None and abs(lead - true_lead) <= 2
                c["mover"] += ok
                detail["mover_ok"] = ok
        details.append(detail)
    return {"per_cause": per_cause, "false": false, "clean_steps": clean_steps, "details": details,
            "stopped": result_stopped}


def _pct(k: int, n: int) -> str:
    return f"{k}/{n} ({100 * k / n:.0f}%)" if n else "n/a"


def table(result: dict[str, Any]) -> str:
    per = result["per_cause"]
    names = ["sentinel", *BASELINES]
    head = ("| cause | injections | " + " | ".join(f"detected: {n}" for n in names)
            + " | first mover top-1 (±2 steps) | cause right |")
    lines = [head, "|" + "---|" * (len(names) + 4)]
    total = {k: 0 for k in ("n", *names, "mover", "mover_n", "cause")}
    for cause in CAUSES:
        c = per[cause]
        for k in total:
            total[k] += c[k]
        mover = _pct(c["mover"], c["mover_n"]) if c["mover_n"] else "n/a (the batch)"
        lines.append(f"| `{cause}` | {c['n']} | " + " | ".join(_pct(c[n], c["n"]) for n in names)
                     + f" | {mover} | {_pct(c['cause'], c['sentinel'])} |")
    lines.append(f"| **all** | {total['n']} | " + " | ".join(_pct(total[n], total["n"]) for n in names)
                 + f" | {_pct(total['mover'], total['mover_n'])} | {_pct(total['cause'], total['sentinel'])} |")
    steps = result["clean_steps"]
    rates = " | ".join(f"{10_000 * result['false'][n] / steps:.2g} ({result['false'][n]})" for n in names)
    lines.append(f"| false spikes / 10k clean steps ({steps} steps) | | {rates} | | |")
    lines.append("")
    lines.append("Attribution (first mover, cause): the sentinel only; the four baselines watch one "
                 "number and cannot name a layer (n/a).")
    stopped = result.get("stopped", [])
    if stopped:
        lines.append("")
        lines.append(f"Runs that went non-finite at the injection, where the sentinel raised `NonFiniteError` "
                     f"(its default) and the run stopped: {', '.join(stopped)}. Counted as detected at the "
                     f"step the error names; the cause is right when the error named a weight rewritten "
                     f"between steps (`weights_changed`: that weight's module is the first mover), else "
                     f"`non_finite` (wrong). The baselines score the losses up to that step.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="heldout", choices=["tune", "heldout", "fresh"])
    parser.add_argument("--refresh", action="store_true", help="run again instead of reading the cache")
    args = parser.parse_args()
    rows = run_split(args.split, args.refresh)
    trained = sum(float(r.get("seconds", 0.0)) for r in rows)  # the runs' own time, resumed ones included
    result = score(rows)
    text = table(result)
    print(text)
    for d in result["details"]:
        if not (d.get("cause_ok") and d.get("mover_ok", True)):
            print("  miss:", json.dumps(d))
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"spikes-{args.split}.md"), "w", encoding="utf-8") as fh:
        fh.write(f"# Loss-spike benchmark, {args.split} split\n\n"
                 f"`python -m benchmarks.spikes.run --split {args.split}` ({len(rows)} runs, {trained:.0f} s of "
                 f"training with the sentinel attached, base checkpoint pretrained apart)\n\n"
                 + text + "\n")
    with open(os.path.join(RESULTS, f"spikes-{args.split}.json"), "w", encoding="utf-8") as fh:
        json.dump({k: v for k, v in result.items()}, fh, indent=1, default=lambda o: list(o) if isinstance(o, (np.ndarray,)) else str(o))


if __name__ == "__main__":
    main()
