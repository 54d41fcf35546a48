"""The sentinel's fixed cost per step: the four figures of issue 22 item 7 in one run.

    python -m benchmarks.fixed_cost                 # CPU: about 4 minutes on 2 cores
    python -m benchmarks.fixed_cost --quick         # smoke run (a few steps), written only with --out

Timing (``--models``, default ``stack10,mlp,stack500``): the bare loop, the **empty-hooks floor**,
the sentinel with **every detector off**, and the sentinel default (every detector on, ``check="auto"``), with and without TensorBoard
(``log_dir``), each on its own copy of the model (same weights, same batches). After warm-up
past step 110 (the steady state of a long run: one sampled step in fifty), the variants step in
turn, one step each, the order rotating every round, so adjacent steps share the machine's
state. Reported per variant: the median of the per-round ratios to the bare step with their
interquartile range, and the total-time ratio (which spreads the detector window, every 10
steps, and the sampled steps over the others): the targets are read on the total-time ratio.

**Every detector off** (``attach(disable=<every built-in kind>)``) is what the collection costs
by itself: the probes every sentinel runs (the step's row, the gradient norms, the finite
checks, the records to the host), with no detector's own probe and no detector window. What
the default adds over it is the detectors'.

The floor is the cost of Python hook dispatch alone: the same number of hooks as the sentinel
has on an ordinary step, doing nothing (a forward pre-hook and a forward hook per hook the
sentinel keeps on each module, a pre-hook on the node that made the model's output, the
optimizer's step pre- and post-hooks). The sentinel's process-wide function patches (the loss
functions, ``torch.autograd.backward``, ``zero_grad``) are shared by every variant in the
process, as in ``benchmarks.overhead``: the bare loop and the floor go through them too.

Counts (no timing, exact): Python function calls per step added over the bare loop (cProfile,
steps 110-159), and launching ops per module per step added over the bare loop, counted at the
dispatcher (``torch_sentinel.testing.count_launches``) over steps 110-159 (one sampled step),
on a 100-module Linear(16)/Tanh stack and a 4-layer HF GPT-2 (when transformers is installed):

- **CPU path**, as a CPU user runs it: ``attach(model, opt)`` (``check="auto"``: immediate on
  CPU, one ``aminmax`` per recorded tensor);
- **accelerator path**, labelled: ``check="deferred"`` with the fused multi-tensor reductions
  forced on CPU (``batch.FUSED_ON_CPU``), what a GPU run launches.

Each is also given without the ``loss_spike`` probe (its device ring is per step and per
parameter, not per module), labelled, so the two parts can be told apart.

Writes ``<out>/fixed-cost-cpu.json`` and ``fixed-cost-cpu.md``.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import gc
import json
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from typing import Any, Callable, Optional

import torch
from torch import nn

import torch_sentinel
from torch_sentinel._collect import batch as _batch
from torch_sentinel._collect.hookset import ModuleHook
from torch_sentinel.detectors import builtin_detectors
from torch_sentinel.testing import count_launches

from . import models as bench_models

__all__ = ["main"]

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
VARIANTS = ("bare", "empty_hooks", "collection", "sentinel", "sentinel_tb")
LABELS = {
    "bare": "bare loop",
    "empty_hooks": "empty hooks (floor)",
    "collection": "every detector off",
    "sentinel": "sentinel default",
    "sentinel_tb": "sentinel + TensorBoard",
}
#: Issue 22 item 7: (workload, limit on the sentinel's total-time ratio).
TIME_TARGETS = {"stack10": 1.3, "mlp": 1.05, "stack500": 1.15}
LAUNCH_TARGET = 0.5
WARMUP = 110
MAX_ROUNDS = 2000
Step = Callable[[], None]


def workload(name: str) -> bench_models.Workload:
    torch.manual_seed(0)
    if name.startswith("stack"):
        return bench_models.deep_stack(torch.device("cpu"), int(name[len("stack"):]))
    return bench_models.build(name, torch.device("cpu"))


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def _sentinel_hooks(model: nn.Module) -> list[tuple[int, int]]:
    """(pre-hooks, hooks) of the sentinel's on each module, in ``model.modules()`` order."""
    return [(sum(isinstance(h, ModuleHook) for h in m._forward_pre_hooks.values()),
             sum(isinstance(h, ModuleHook) for h in m._forward_hooks.values())) for m in model.modules()]


class Trainer:
    """One model copy under one variant; ``hooks`` is what the floor mirrors (from a sentinel)."""

    def __init__(self, name: str, variant: str, workdir: str, hooks: Optional[list[tuple[int, int]]] = None) -> None:
        self.w = workload(name)
        self.model = self.w.model
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.sentinel = None
        self.grad_hook = False
        if variant.startswith("sentinel"):
            log_dir = os.path.join(workdir, f"{name}-{variant}") if variant == "sentinel_tb" else None
            self.sentinel = torch_sentinel.attach(self.model, self.opt, log_dir=log_dir)
        elif variant == "collection":  # the probes every sentinel runs, without a detector's own
            every_kind = {cls.kind for cls in builtin_detectors()}
            self.sentinel = torch_sentinel.attach(self.model, self.opt, disable=every_kind)
        elif variant == "empty_hooks":
            for m, (pre, post) in zip(self.model.modules(), hooks or []):
                for _ in range(pre):
                    m.register_forward_pre_hook(_noop)
                for _ in range(post):
                    m.register_forward_hook(_noop)
            self.opt.register_step_pre_hook(_noop)
            self.opt.register_step_post_hook(_noop)
            self.grad_hook = True
        self.i = 0

    def step(self) -> None:
        x, y = self.w.batch(self.i)
        self.i += 1
        self.opt.zero_grad(set_to_none=True)
        out = self.model(x)
        if self.grad_hook and out.grad_fn is not None:
            out.grad_fn.register_prehook(_noop)
        self.w.loss_fn(out, y).backward()
        self.opt.step()

    def close(self) -> None:
        if self.sentinel is not None:
            self.sentinel.detach()


def _quantiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


def time_model(name: str, seconds: float, workdir: str, warmup: int = WARMUP) -> dict[str, Any]:
    """The variants stepping in turn, one step each, past ``warmup``; per-round ratios to bare."""
    probe = Trainer(name, "sentinel", workdir)
    for _ in range(warmup):
        probe.step()
    hooks = _sentinel_hooks(probe.model)
    probe.close()
    trainers = {v: Trainer(name, v, workdir, hooks) for v in VARIANTS}
    for t in trainers.values():
        for _ in range(warmup):
            t.step()
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    order = list(VARIANTS)
    collections = _Collections()
    start, rounds = time.perf_counter(), 0
    gc.callbacks.append(collections)
    try:
        # At least 8 rounds; then until ``seconds`` have passed (at most MAX_ROUNDS).
        while rounds < 8 or (rounds < MAX_ROUNDS and time.perf_counter() - start < seconds):
            k = rounds % len(order)
            rounds += 1
            for v in order[k:] + order[:k]:
                t = trainers[v]
                collections.variant = v
                t0 = time.perf_counter()
                t.step()
                times[v].append(time.perf_counter() - t0)
    finally:
        gc.callbacks.remove(collections)
    for t in trainers.values():
        t.close()
    bare = times["bare"]
    out: dict[str, Any] = {"rounds": rounds, "steps": f"{warmup}-{warmup + rounds - 1}",
                           "floor_hooks": sum(a + b for a, b in hooks) + 3}
    for v in VARIANTS:
        ratios = [a / b for a, b in zip(times[v], bare)]
        lo, med, hi = _quantiles(ratios)
        out[v] = {"median_ms": statistics.median(times[v]) * 1e3, "ratio_median": med, "ratio_q1": lo,
                  "ratio_q3": hi, "ratio_total": sum(times[v]) / sum(bare),
                  "added_us_per_step": (sum(times[v]) - sum(bare)) / rounds * 1e6,
                  "gc_us_per_step": collections.seconds[v] / rounds * 1e6,
                  "gc_full": collections.full[v]}
    return out


class _Collections:
    """Python's garbage collections during the timed steps, charged to the variant whose step
    ran them (a gc callback). The collector is process-wide: a collection runs in the step that
    tips its count, and carries every variant's live objects along."""

    def __init__(self) -> None:
        self.variant = ""
        self.seconds: dict[str, float] = {v: 0.0 for v in VARIANTS}
        self.full: dict[str, int] = {v: 0 for v in VARIANTS}
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        if self.variant in self.seconds:
            self.seconds[self.variant] += time.perf_counter() - self._t0
            self.full[self.variant] += info["generation"] == 2


def python_calls(name: str, steps: int = 50, warmup: int = WARMUP) -> dict[str, float]:
    """Python function calls per step (cProfile: exact), bare and sentinel, past ``warmup``."""
    out = {}
    with tempfile.TemporaryDirectory() as workdir:
        for v in ("bare", "sentinel"):
            t = Trainer(name, v, workdir)
            for _ in range(warmup):
                t.step()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(steps):
                t.step()
            prof.disable()
            t.close()
            out[v] = pstats.Stats(prof).total_calls / steps  # type: ignore[attr-defined]
    out["added"] = out["sentinel"] - out["bare"]
    return out


# ---------------------------------------------------------------------------------- launches
Build = Callable[[], tuple[nn.Module, Callable[[int], torch.Tensor]]]


def stack100() -> tuple[nn.Module, Callable[[int], torch.Tensor]]:
    """100 modules: Linear(16)/Tanh pairs, batch 4 (also the model of tests/collect/test_launches.py)."""
    model = nn.Sequential(*[nn.Linear(16, 16) if i % 2 == 0 else nn.Tanh() for i in range(100)])
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(4, 16, generator=g) for _ in range(2)]
    ys = [torch.randn(4, 16, generator=g) for _ in range(2)]
    return model, lambda i: nn.functional.mse_loss(model(xs[i % 2]), ys[i % 2])


def gpt2_4() -> tuple[nn.Module, Callable[[int], torch.Tensor]]:
    """A 4-layer HF GPT-2 from a config (no download), 60 modules."""
    import transformers

    cfg = transformers.GPT2Config(
        n_layer=4, n_embd=32, n_head=4, vocab_size=128, n_positions=16, bos_token_id=0, eos_token_id=0,
        attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0,
    )
    model = transformers.GPT2LMHeadModel(cfg)
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, 128, (2, 12), generator=g) for _ in range(2)]
    return model, lambda i: model(ids[i % 2], labels=ids[i % 2]).loss


def added_launches(build: Build, fused: bool, check: str, disable: frozenset[str] = frozenset(),
                   warm: int = WARMUP, steps: int = 50, counter: Callable[[], Any] = count_launches,
                   **options: Any) -> dict[str, Any]:
    """(sentinel - bare) launching ops per module per step, and the ops added per step.
    ``options`` go to ``attach()`` (``flush_every=1000``: steps without a flush, as the unit
    test of the launch counts reads them). ``counter``: a context manager factory whose value
    has ``count`` and ``ops`` (by op name), as ``count_launches``; the tests also count views.
    Also used by ``tests/collect/test_launches.py``."""

    def count(attach: bool, warm: int, steps: int) -> tuple[float, int, dict[str, int]]:
        torch.manual_seed(0)
        model, loss_at = build()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        s = torch_sentinel.attach(model, opt, check=check, disable=disable, **options) if attach else None

        def step(i: int) -> None:
            opt.zero_grad()
            loss_at(i).backward()
            opt.step()

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i in range(warm):
                step(i)
            with counter() as c:
                for i in range(warm, warm + steps):
                    step(i)
        if s is not None:
            s.detach()
        return c.count / steps, sum(1 for _ in model.modules()), dict(c.ops)

    was = _batch.FUSED_ON_CPU
    _batch.FUSED_ON_CPU = fused
    try:
        bare, modules, bare_ops = count(False, 1, 2)
        sentinel, _, ops = count(True, warm, steps)
    finally:
        _batch.FUSED_ON_CPU = was
    added = {k: round(ops.get(k, 0) / steps - bare_ops.get(k, 0) / 2, 2) for k in set(ops) | set(bare_ops)}
    return {"per_module": (sentinel - bare) / modules, "modules": modules, "per_step": sentinel - bare,
            "ops": dict(sorted(((k, v) for k, v in added.items() if v), key=lambda kv: -kv[1]))}


def launches(quick: bool) -> dict[str, Any]:
    builds: dict[str, Build] = {"stack100": stack100}
    try:
        import transformers  # noqa: F401

        builds["gpt2-4"] = gpt2_4
    except ImportError:
        pass
    paths = {"cpu": (False, "auto"), "accelerator": (True, "deferred")}
    out: dict[str, Any] = {}
    for name, build in builds.items():
        for path, (fused, check) in paths.items():
            for label, disable in (("all", frozenset()), ("no_loss_spike", frozenset({"loss_spike"}))):
                out[f"{name}/{path}/{label}"] = added_launches(
                    build, fused, check, disable, warm=3 if quick else WARMUP, steps=2 if quick else 50)
    return out


# ---------------------------------------------------------------------------------- report
def _fmt(e: dict[str, Any]) -> str:
    return (f"{e['ratio_median']:.2f}\u00d7 ({e['ratio_q1']:.2f}\u2013{e['ratio_q3']:.2f}), "
            f"total {e['ratio_total']:.2f}\u00d7, {e['added_us_per_step']:+.0f} \u00b5s")


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, limit in TIME_TARGETS.items():
        r = results["timing"].get(name)
        if r is None:
            continue
        for v in ("sentinel", "sentinel_tb"):
            rows.append({"target": f"{name}: {LABELS[v]} total-time ratio <= {limit}",
                         "value": round(r[v]["ratio_total"], 3), "met": r[v]["ratio_total"] <= limit,
                         "collection": round(r["collection"]["ratio_total"], 3),
                         "floor": round(r["empty_hooks"]["ratio_total"], 3)})
    for key, r in results["launches"].items():
        if key.endswith("/cpu/all"):
            rows.append({"target": f"{key.split('/')[0]}: added launching ops per module per step, CPU path <= "
                                   f"{LAUNCH_TARGET}", "value": round(r["per_module"], 3),
                         "met": r["per_module"] <= LAUNCH_TARGET, "floor": 0, "collection": None})
    return rows


def to_markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [f"## The sentinel's fixed cost per step (CPU: {m['cpu']}, {m['threads']} torch threads)", "",
             f"torch {m['torch']}, Python {m['python']}, {results['when']}. Command: `{results['command']}`", "",
             "Each cell: median per-round ratio to the bare step (interquartile range), the total-time ratio "
             "(detector windows and sampled steps included: what the targets read), and the time added per "
             "step. Variants step in turn, one step each, order rotating, past step "
             f"{WARMUP}. Method: `benchmarks/README.md` (Fixed cost).", "",
             "| workload | bare ms/step | " + " | ".join(LABELS[v] for v in VARIANTS[1:]) + " | rounds | floor hooks |",
             "|---|---|" + "---|" * (len(VARIANTS) - 1) + "---|---|"]
    for name, r in results["timing"].items():
        lines.append(f"| {name} | {r['bare']['median_ms']:.2f} | " + " | ".join(_fmt(r[v]) for v in VARIANTS[1:])
                     + f" | {r['rounds']} | {r['floor_hooks']} |")
    lines += ["", "Python garbage collection in the timed steps, charged to the variant whose step ran it "
              "(\u00b5s a step; full collections):", "",
              "| workload | " + " | ".join(LABELS[v] for v in VARIANTS) + " |", "|---|" + "---|" * len(VARIANTS)]
    for name, r in results["timing"].items():
        lines.append(f"| {name} | " + " | ".join(
            f"{r[v].get('gc_us_per_step', 0.0):.0f} ({r[v].get('gc_full', 0)})" for v in VARIANTS) + " |")
    lines += ["", "### Launching ops added per module per step (dispatcher count, steps "
              f"{WARMUP}-{WARMUP + 49})", "",
              "| model | path | every detector | without loss_spike | ops added per step (every detector) |",
              "|---|---|---|---|---|"]
    for key, r in results["launches"].items():
        model, path, label = key.split("/")
        if label != "all":
            continue
        other = results["launches"].get(f"{model}/{path}/no_loss_spike")
        name = "CPU (attach default, check='auto')" if path == "cpu" else \
            "accelerator (check='deferred', fused, forced on CPU)"
        ops = ", ".join(f"{k} {v:g}" for k, v in list(r["ops"].items())[:10])
        lines.append(f"| {model} ({r['modules']} modules) | {name} | {r['per_module']:.3f} | "
                     f"{other['per_module']:.3f} | {ops} |" if other else "")
    if results.get("calls"):
        lines += ["", "### Python function calls per step (cProfile, exact)", "",
                  "| workload | bare | sentinel | added |", "|---|---|---|---|"]
        for name, c in results["calls"].items():
            lines.append(f"| {name} | {c['bare']:.0f} | {c['sentinel']:.0f} | {c['added']:.0f} |")
    lines += ["", "### Targets (issue 22 item 7)", "",
              "| target | value | every detector off | empty-hooks floor | met |", "|---|---|---|---|---|"]
    for t in results["targets"]:
        off = "\u2013" if t.get("collection") is None else t["collection"]
        lines.append(f"| {t['target']} | {t['value']} | {off} | {t['floor']} | {'yes' if t['met'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(TIME_TARGETS), help="timed workloads (stackN, mlp, cnn, ...)")
    p.add_argument("--seconds", type=float, default=40.0, help="seconds of timed rounds per workload")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--no-launches", dest="launches", action="store_false")
    p.add_argument("--no-calls", dest="calls", action="store_false")
    p.add_argument("--calls-models", default=",".join(TIME_TARGETS), help="workloads whose Python calls are counted")
    p.add_argument("--quick", action="store_true", help="smoke run: a few steps, written only with --out")
    p.add_argument("--out", default=None, help=f"where the results go (default {RESULTS_DIR})")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    models = [m for m in args.models.split(",") if m]
    results: dict[str, Any] = {
        "command": "python -m benchmarks.fixed_cost " + " ".join(argv if argv is not None else sys.argv[1:]),
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "threads": torch.get_num_threads(), "torch": torch.__version__,
                    "python": platform.python_version()},
        "timing": {}, "launches": {}, "calls": {},
    }
    with tempfile.TemporaryDirectory() as workdir:
        for name in models:
            warm = 12 if args.quick else WARMUP
            results["timing"][name] = r = time_model(name, 0.5 if args.quick else args.seconds, workdir, warm)
            print(f"{name}: bare {r['bare']['median_ms']:.2f} ms; "
                  + "; ".join(f"{v} {_fmt(r[v])}" for v in VARIANTS[1:]), flush=True)
    if args.calls:
        for name in args.calls_models.split(","):
            results["calls"][name] = c = python_calls(name, 2 if args.quick else 50, 12 if args.quick else WARMUP)
            print(f"{name}: python calls per step {c}", flush=True)
    if args.launches:
        results["launches"] = launches(args.quick)
        for key, r in results["launches"].items():
            print(f"{key}: {r['per_module']:.3f} per module per step; {r['ops']}", flush=True)
    results["targets"] = targets(results)
    md = to_markdown(results)
    print(md)
    out = args.out if args.out is not None else (None if args.quick else RESULTS_DIR)
    if out is not None:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "fixed-cost-cpu.json"), "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.join(out, "fixed-cost-cpu.md"), "w") as f:
            f.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
