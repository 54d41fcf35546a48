"""Offline development of the forensics on recorder traces (tuning seeds only).

    python -m benchmarks.spikes.develop --record      # run the tuning injections with the recorder
    python -m benchmarks.spikes.develop               # replay detection + forensics on them

The replay does what the sentinel does, from the recorded figures: the robust z of each loss,
the spike seen at the next flush (every 10 steps), the last K = 32 steps as the ring holds them
then, folded into units, and :func:`attribute`. Traces are cached under ``--cache``.
"""

from __future__ import annotations

import argparse
import os
import pickle
from typing import Any, Optional

import numpy as np

from torch_sentinel._collect.spike_ring import unit_layout
from torch_sentinel.detectors._spike_forensics import SpikeVerdict, SpikeWindow, attribute, per_unit
from torch_sentinel.detectors._spike_watch import RobustLossWatch

from .plan import runs_for
from .train import Trace, run

RING = 32
FLUSH = 10


def window_from_trace(trace: Trace, spike_step: int, ring: int = RING, flush: int = FLUSH) -> SpikeWindow:
    """The window the sentinel would see for a spike at ``spike_step`` of a recorder trace."""
    lay, data = trace.layout, trace.recorded
    seen_at = min(((spike_step // flush) + 1) * flush - 1, len(trace.loss) - 1)
    lo = max(seen_at - ring + 1, 0)
    steps = np.arange(lo, seen_at + 1)
    layout = unit_layout(lay["params"], lay["owners"], lay["groups"], lay["numel"], lay["attention"], lay["output"])
    u = len(layout.units)
    stats = {}
    for name, how in (("grad", "l2"), ("update", "l2"), ("weight", "l2"), ("exp_avg", "l2"), ("exp_avg_sq", "sum")):
        stats[name] = per_unit(data[name][lo : seen_at + 1], layout.unit_of, u, how)
    attn = np.full((len(steps), u), np.nan)
    for j, name in enumerate(lay["attention"]):
        attn[:, layout.unit_index(name)] = data["attention_logit"][lo : seen_at + 1, j]
    stats["attention_logit"] = attn
    lse = np.full((len(steps), u), np.nan)
    lse[:, layout.unit_index(lay["output"])] = data["output_lse"][lo : seen_at + 1]
    stats["output_lse"] = lse
    lrs = {g: data["lr"][lo : seen_at + 1, i] for i, g in enumerate(lay["lr_groups"])}
    return SpikeWindow(steps, spike_step, list(layout.units), stats, lrs, list(layout.unit_lr),
                       trace.loss[lo : seen_at + 1], data["inputs"][lo : seen_at + 1])


def spikes(loss: np.ndarray) -> list[int]:
    watch = RobustLossWatch()
    return [s.step for step, value in enumerate(loss) if (s := watch.add(step, float(value))) is not None]


def judge(trace: Trace) -> list[tuple[int, SpikeVerdict]]:
    return [(s, attribute(window_from_trace(trace, s))) for s in spikes(trace.loss)]


def inside(named: Optional[str], target: Optional[str]) -> bool:
    """Whether ``named`` is ``target`` or a module inside it."""
    if named is None or target is None:
        return False
    base = named.split("[")[0]
    return base == target or base.startswith(target + ".")


def load_or_record(split: str, cache: str, record: bool) -> list[Trace]:
    os.makedirs(cache, exist_ok=True)
    traces = []
    for spec in runs_for(split):
        path = os.path.join(cache, f"{split}-{spec.name}.pkl")
        if os.path.exists(path):
            with open(path, "rb") as fh:
                traces.append(pickle.load(fh))
            continue
        if not record:
            continue
        trace = run(spec, watch="recorder")
        with open(path, "wb") as fh:
            pickle.dump(trace, fh)
        print(f"recorded {spec.name} ({trace.seconds:.0f} s)", flush=True)
        traces.append(trace)
    return traces


def report(traces: list[Trace]) -> dict[str, Any]:
    rows = []
    for trace in traces:
        inj = trace.run.injection
        found = judge(trace)
        if inj is None:
            rows.append({"run": trace.run.name, "false_spikes": len(found), "steps": len(trace.loss)})
            for s, v in found:
                print(f"  clean {trace.run.name}: spike at {s} -> {v.cause} {v.first_mover}")
            continue
        hits = [(s, v) for s, v in found if inj.t0 <= s <= inj.t0 + 30]
        if not hits:
            print(f"MISS {trace.run.name}: {inj.describe()}; spikes at {[s for s, _ in found]}")
            rows.append({"run": trace.run.name, "cause": inj.cause, "detected": False})
            continue
        s, v = hits[0]
        true_lead = s - inj.t0
        mover_ok = inj.module is None or (inside(v.first_mover, inj.module) and v.lead_steps is not None
                                          and abs(v.lead_steps - true_lead) <= 2)
        ok = "ok " if (v.cause == inj.cause and mover_ok) else "BAD"
        print(f"{ok} {trace.run.name}: {inj.describe()}: spike at {s} (true lead {true_lead}) -> {v.cause}, "
              f"{v.first_mover} lead {v.lead_steps}; {v.why}; top: "
              + ", ".join(f"{m.unit}/{m.stat}/{m.lead_steps}/{m.deviation:.3g}" for m in v.ranked[:4]))
        rows.append({"run": trace.run.name, "cause": inj.cause, "detected": True, "cause_ok": v.cause == inj.cause,
                     "mover_ok": mover_ok if inj.module else None})
    return {"rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--split", default="tune")
    parser.add_argument("--cache", default=os.path.join("benchmarks", "spikes", "cache"))
    args = parser.parse_args()
    traces = load_or_record(args.split, args.cache, args.record)
    rows = report(traces)["rows"]
    inj = [r for r in rows if "cause" in r]
    det = [r for r in inj if r["detected"]]
    print(f"detected {len(det)}/{len(inj)}; cause right {sum(r['cause_ok'] for r in det)}/{len(det)}; "
          f"mover right {sum(bool(r['mover_ok']) for r in det if r['mover_ok'] is not None)}/"
          f"{sum(1 for r in det if r['mover_ok'] is not None)}; false spikes "
          f"{sum(r['false_spikes'] for r in rows if 'false_spikes' in r)} in {sum(r['steps'] for r in rows if 'steps' in r)} clean steps")


if __name__ == "__main__":
    main()
