"""Where the sentinel's time goes on each model: Python in its hooks vs the tensor ops they launch.

    python -m benchmarks.profile_sentinel [--models mlp,cnn,transformer,stack10] [--steps 10] [--warmup 110]

Two views of the same steps, sentinel default against the bare loop:

- ``cProfile``: inclusive time of each torch_sentinel entry point (hooks, step hooks, flush)
  and the hottest torch_sentinel lines by own time (file:line);
- ``torch.profiler``: CPU time per aten op, so the ops the sentinel adds (aminmax, minimum,
  maximum, _foreach_norm, stack, copy_, ...) show up as the difference to the bare loop.

cProfile inflates Python time, so read the shares, not the absolute figures.
Writes ``<out>/profile-<device>.md``.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from typing import Any, Optional

import torch
from torch.profiler import ProfilerActivity, profile

import torch_sentinel

from . import models as bench_models
from .overhead import RESULTS_DIR

__all__ = ["main"]

PACKAGE_DIR = os.path.dirname(torch_sentinel.__file__)
#: The ways into the sentinel from the training loop.
ENTRY_POINTS = (
    "on_root_inputs",  # ForwardEvents: the root's forward pre-hook
    "on_output",  # ForwardEvents: a hooked module's output (the root's on every step)
    "on_root_exit",
    "_on_output_grad",  # a watched output's gradient in backward
    "before_backward",  # BackwardEvents, through the torch.autograd.backward patch
    "after_backward",
    "on_pre_step",  # OptimizerEvents: the optimizer's step pre-hook (norms, spike ring, ...)
    "on_post_step",  # OptimizerEvents: the step post-hook (the row closes)
    "close_row",
    "drain",
    "_on_record",  # Sentinel: a landed record (the detectors' window every flush_every)
    "_flush_window",
    "_on_enter",  # ShapeWatch: the root's entry
    "_on_exit",
)


class Trainer:
    def __init__(self, name: str, device: torch.device, sentinel: bool) -> None:
        if name.startswith("stack"):  # stack10, stack500: the scaling table's Linear/Tanh stacks
            torch.manual_seed(0)
            self.w = bench_models.deep_stack(device, int(name[len("stack"):]))
        else:
            self.w = bench_models.build(name, device)
        self.opt = torch.optim.AdamW(self.w.model.parameters(), lr=1e-4)
        self.sentinel = torch_sentinel.attach(self.w.model, self.opt) if sentinel else None
        self.i = 0

    def run(self, n: int) -> None:
        for _ in range(n):
            x, y = self.w.batch(self.i)
            self.opt.zero_grad(set_to_none=True)
            self.w.loss_fn(self.w.model(x), y).backward()
            self.opt.step()
            self.i += 1

    def close(self) -> None:
        if self.sentinel is not None:
            self.sentinel.detach()


def _python_view(t: Trainer, steps: int) -> dict[str, Any]:
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    t.run(steps)
    prof.disable()
    total = time.perf_counter() - t0
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    entry: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for (path, line, func), (_, _, tottime, cumtime, _) in stats.items():
        if not path.startswith(PACKAGE_DIR):
            continue
        where = f"{os.path.relpath(path, os.path.dirname(PACKAGE_DIR))}:{line} {func}"
        own[where] += tottime
        if func in ENTRY_POINTS:
            entry[where] += cumtime
    return {"total_s": total, "entry": entry, "own": own}


def _op_view(t: Trainer, steps: int) -> Counter[str]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t.run(steps)
    return Counter({e.key: e.self_cpu_time_total / 1e3 for e in prof.key_averages()})  # ms


def profile_model(name: str, device: torch.device, steps: int, warmup: int = 110) -> str:
    bare, sent = Trainer(name, device, False), Trainer(name, device, True)
    try:
        for t in (bare, sent):
            t.run(warmup)
        py_bare = _python_view(bare, steps)
        py = _python_view(sent, steps)
        ops_bare, ops = _op_view(bare, steps), _op_view(sent, steps)
    finally:
        sent.close()
    per_step = 1e3 / steps
    lines = [
        f"### {name}: {bare.w.description}, steps {warmup}-{warmup + steps - 1}",
        "",
        f"Under cProfile: bare {py_bare['total_s'] * per_step:.1f} ms/step, sentinel {py['total_s'] * per_step:.1f} ms/step.",
        "",
        "| sentinel entry point (inclusive) | ms/step |",
        "|---|---|",
    ]
    lines += [f"| `{k}` | {v * per_step:.3f} |" for k, v in py["entry"].most_common()]
    lines += ["", "| hottest torch_sentinel lines (own time) | ms/step |", "|---|---|"]
    lines += [f"| `{k}` | {v * per_step:.3f} |" for k, v in py["own"].most_common(12)]
    added = Counter({k: v - ops_bare.get(k, 0.0) for k, v in ops.items()})
    lines += ["", "| aten op: self CPU time added over bare | ms/step |", "|---|---|"]
    lines += [f"| `{k}` | {v * per_step / 1e3:.3f} |" for k, v in added.most_common(12) if v > 0]
    total_added = sum(v for v in added.values())
    lines += [
        "",
        f"Profiled op time added in total: {total_added * per_step / 1e3:.3f} ms/step.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    warnings.filterwarnings("ignore", module="torch_sentinel")
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.profile_sentinel",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--models", default="mlp,cnn,transformer")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=110,
                   help="steps before the profile: past 100, one sampled step in fifty (a long run's steady state)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", default=RESULTS_DIR)
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device("cpu")
    sections = [
        f"## Where torch_sentinel's time goes (CPU, torch {torch.__version__}, {torch.get_num_threads()} threads)",
        "",
    ]
    for name in a.models.split(","):
        print(f"[profile] {name} ...", file=sys.stderr, flush=True)
        sections.append(profile_model(name, device, a.steps, a.warmup))
    text = "\n".join(sections)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "profile-cpu.md")
    with open(path, "w") as f:
        f.write(text)
    print(text)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
