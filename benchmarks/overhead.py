"""Training-step overhead of torch_sentinel against the bare loop and the alternatives.

One command (CPU, about 8 minutes on 2 cores)::

    python -m benchmarks.overhead

GPU (one prepared command; eager + torch.compile, CUDA-event timing, sync audit)::

    python -m benchmarks.overhead --device cuda

Method: every variant trains its own copy of the model (same initial weights, same batches).
After warm-up (the sentinel variants past step 100, into the steady state of a long run: see
``SCALING_WARMUP``), rounds run every variant for the same number of steps, interleaved, the order
rotating each round; a variant's cost in a round is its time per step over the bare loop's in
that same round, so drift of the machine cancels. Reported: the median of those per-round
ratios with min-max, the mean ratio (total time over total bare time, which spreads the
sentinel's periodic flush over its steps), and absolute medians in ms. A paired run then
times the bare loop and the sentinel default alternating step by step, past step 100: the
finest interleaving, for the headline steady-state ratio (``bench_paired``).

Writes ``<out>/overhead-<device>.json`` and ``<out>/overhead-<device>.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import json
import multiprocessing
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Sequence
from typing import Any, Callable, Optional

import torch

from torch_sentinel.testing import count_host_syncs, cuda_sync_guard

from . import models as bench_models
from .variants import DEFAULT_VARIANTS, SentinelVariant, Variant, make_variant

__all__ = ["Config", "main", "run"]

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SENTINEL = "sentinel"
#: Variants timed under torch.compile by default: compiling all ten per model would not fit a
#: short GPU slot, and these are the ones the compiled targets are about.
COMPILE_VARIANTS = ("bare", "sentinel", "sentinel_deferred", "clip_grad_norm")
SCALING_VARIANTS = ("bare", "sentinel", "sentinel_deferred", "naive_hooks")
#: Warm-up steps of the scaling runs: past the sentinel's denser sampling of the first 100 steps
#: (``torch_sentinel._collect.cadence``), the steady state of a long run (one sampled step in 50).
SCALING_WARMUP = 102
X, DASH = "\u00d7", "\u2013"  # the multiplication sign and en dash of the tables


@dataclasses.dataclass
class Config:
    device: str = "cpu"
    models: Sequence[str] = ("mlp", "cnn", "transformer")
    variants: Sequence[str] = tuple(DEFAULT_VARIANTS)
    rounds: int = 12
    round_seconds: float = 0.5
    max_steps_per_round: int = 50
    warmup: int = 3
    #: Warm-up of the sentinel variants: past the denser sampling of the first 100 steps, so the
    #: rounds time what a long run pays per step; 0 times the first steps instead.
    sentinel_warmup: int = SCALING_WARMUP
    audit_steps: int = 5
    compile: bool = False
    compile_variants: Sequence[str] = COMPILE_VARIANTS
    memory: bool = True
    memory_steps: int = 3
    #: Variants whose memory is measured; empty means all of ``variants``.
    memory_variants: Sequence[str] = ()
    scaling: Sequence[int] = (10, 100, 500, 1000)
    #: Seconds per model of the paired steady-state run (bare and sentinel alternating step by
    #: step); 0 skips it.
    paired_seconds: float = 40.0
    paired_max_steps: int = 400
    scaling_rounds: int = 5
    tiny: bool = False
    threads: int = 0
    budget_s: float = 0.0
    out: str = RESULTS_DIR
    command: str = ""


class Deadline:
    """Skips whole sections once the time budget is spent, so a short GPU slot still returns
    the figures it did get (0 means no budget)."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds if seconds > 0 else None

    def passed(self) -> bool:
        return self.end is not None and time.monotonic() > self.end


# ---------------------------------------------------------------------------------- timing
class Timer:
    """Wall time on CPU; on CUDA, events around the steps, read after they complete."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def time(self, fn: Callable[[], None]) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()  # after the timed region: reading the result, not part of it
            return start.elapsed_time(end) / 1000.0
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


class Contestant:
    """One model copy trained under one variant."""

    def __init__(
        self,
        workload: bench_models.Workload,
        variant: Variant,
        workdir: str,
        compiled: bool = False,
    ) -> None:
        self.workload = workload
        self.variant = variant
        self.model = workload.model
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        variant.setup(self.model, self.optimizer, workdir)
        # Compiled after the hooks are in place: hooks added to an already compiled model are
        # silently skipped (prior-art.md).
        self.forward: Callable[..., Any] = torch.compile(self.model) if compiled else self.model
        self.steps = 0

    def step(self) -> None:
        x, y = self.workload.batch(self.steps)
        self.optimizer.zero_grad(set_to_none=True)
        with self.variant.region():
            loss = self.workload.loss_fn(self.forward(x), y)
            loss.backward()
        self.variant.after_backward(self.steps)
        self.optimizer.step()
        self.steps += 1

    def run(self, n: int) -> None:
        for _ in range(n):
            self.step()

    def close(self) -> None:
        self.variant.close()


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[
        :300
    ]


def _build_contestants(
    model_name: str,
    variants: Sequence[str],
    device: torch.device,
    cfg: Config,
    workroot: str,
    compiled: bool,
) -> tuple[dict[str, Contestant], dict[str, str], dict[str, Any]]:
    contestants: dict[str, Contestant] = {}
    skipped: dict[str, str] = {}
    described: dict[str, Any] = {}
    for name in variants:
        variant = make_variant(name)
        reason = variant.unavailable()
        if reason:
            skipped[name] = reason
            continue
        workdir = os.path.join(
            workroot, f"{model_name}-{'compiled' if compiled else 'eager'}-{name}"
        )
        os.makedirs(workdir, exist_ok=True)
        try:
            c = Contestant(
                bench_models.build(model_name, device, cfg.tiny), variant, workdir, compiled
            )
            sentinel = isinstance(variant, SentinelVariant)
            c.run(max(cfg.warmup, cfg.sentinel_warmup) if sentinel else cfg.warmup)
            if sentinel:
                if not variant.hooks_ran():
                    raise RuntimeError("the sentinel's forward hooks did not run (compiled away?)")
                described[name] = variant.describe()
        except Exception as exc:  # one broken alternative must not cost the whole run
            skipped[name] = _error(exc)
            print(f"  {name}: skipped, {skipped[name]}", file=sys.stderr)
            traceback.print_exc(limit=3, file=sys.stderr)
            with contextlib.suppress(Exception):
                variant.close()
            continue
        contestants[name] = c
    return contestants, skipped, described


def _time_rounds(
    contestants: dict[str, Contestant],
    device: torch.device,
    rounds: int,
    steps: int,
    failed: Optional[dict[str, str]] = None,
) -> dict[str, list[float]]:
    """Per-step seconds of each variant in each round, variants interleaved, order rotating.

    A variant that raises is dropped (its reason goes to ``failed``), so one broken
    alternative does not cost the figures of the others."""
    timer = Timer(device)
    names = list(contestants)
    per_step: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            if name not in per_step:
                continue
            c = contestants[name]
            try:
                seconds = timer.time(lambda c=c: c.run(steps))  # type: ignore[misc]
            except Exception as exc:
                if name == "bare" or failed is None:
                    raise
                failed[name] = f"failed in round {r}: {_error(exc)}"
                print(f"  {name}: {failed[name]}", file=sys.stderr)
                del per_step[name]
                continue
            per_step[name].append(seconds / steps)
    return per_step


def _steps_per_round(c: Contestant, device: torch.device, cfg: Config) -> int:
    seconds = Timer(device).time(lambda: c.run(2)) / 2
    return max(1, min(cfg.max_steps_per_round, round(cfg.round_seconds / max(seconds, 1e-6))))


def summarize(
    per_step: dict[str, list[float]], reference: str = "bare"
) -> dict[str, dict[str, Any]]:
    """Median of per-round ratios to ``reference`` (min-max), mean ratio, absolute medians."""
    ref = per_step[reference]
    out: dict[str, dict[str, Any]] = {}
    for name, times in per_step.items():
        ratios = [t / b for t, b in zip(times, ref)]
        entry = {
            "median_ms": statistics.median(times) * 1e3,
            "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "ratio_mean": sum(times) / sum(ref),
            "rounds": len(times),
        }
        if SENTINEL in per_step and name != SENTINEL:
            entry["vs_sentinel_median"] = statistics.median(
                t / s for t, s in zip(times, per_step[SENTINEL])
            )
        out[name] = entry
    return out


# ---------------------------------------------------------------------------------- sync audit
def _audit(
    contestants: dict[str, Contestant], device: torch.device, steps: int, compiled: bool
) -> dict[str, Any]:
    """Host reads per step on steps without a flush, counted at the dispatcher; on CUDA also
    run under ``set_sync_debug_mode("error")``, where any synchronising call raises."""
    audited = [
        n for n, c in contestants.items() if n == "bare" or isinstance(c.variant, SentinelVariant)
    ]
    out: dict[str, Any] = {}
    for name in audited:
        c = contestants[name]
        c.variant.before_audit()
        entry: dict[str, Any] = {}
        if not compiled:  # a dispatch mode would force compiled graphs back to eager
            with count_host_syncs() as syncs:
                c.run(steps)
            entry["host_reads_per_step"] = syncs.count / steps
            entry["host_read_ops"] = dict(syncs.ops)
        if device.type == "cuda":
            c.variant.before_audit()
            torch.cuda.synchronize()
            try:
                with cuda_sync_guard("error"):
                    c.run(steps)
                entry["cuda_sync_error_mode"] = "ok"
            except RuntimeError as exc:
                entry["cuda_sync_error_mode"] = _error(exc)
        out[name] = entry
    bare = out.get("bare", {}).get("host_reads_per_step")
    if bare is not None:
        for entry in out.values():
            entry["added_host_reads_per_step"] = entry["host_reads_per_step"] - bare
    return out


# ---------------------------------------------------------------------------------- one model
def bench_model(
    model_name: str, cfg: Config, device: torch.device, workroot: str, compiled: bool
) -> dict[str, Any]:
    variants = [v for v in cfg.variants if not compiled or v in cfg.compile_variants]
    if "bare" not in variants:
        variants = ["bare", *variants]
    contestants, skipped, described = _build_contestants(
        model_name, variants, device, cfg, workroot, compiled
    )
    try:
        if "bare" not in contestants:
            raise RuntimeError(f"the bare loop failed: {skipped.get('bare')}")
        audit = _audit(contestants, device, cfg.audit_steps, compiled)
        steps = _steps_per_round(contestants["bare"], device, cfg)
        gc.collect()
        per_step = _time_rounds(contestants, device, cfg.rounds, steps, failed=skipped)
    finally:
        for c in contestants.values():
            with contextlib.suppress(Exception):
                c.close()
    return {
        "model": contestants["bare"].workload.description,
        "steps_per_round": steps,
        "variants": summarize(per_step),
        "skipped": skipped,
        "sentinel_config": described,
        "sync_audit": audit,
    }


# ---------------------------------------------------------------------------------- memory
def _memory_probe(model_name: str, variant_name: str, cfg: Config) -> dict[str, Any]:
    """Peak RSS (CPU, in a fresh process) or peak allocated (CUDA) over a few steps."""
    warnings.filterwarnings("ignore", module="torch_sentinel")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = torch.device(cfg.device)
    workdir = tempfile.mkdtemp(prefix="sentinel-mem-")
    try:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        c = Contestant(
            bench_models.build(model_name, device, cfg.tiny), make_variant(variant_name), workdir
        )
        c.run(cfg.memory_steps)
        c.close()
        if device.type == "cuda":
            return {"peak_mb": (torch.cuda.max_memory_allocated() - base) / 2**20}
        return {"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def bench_memory(model_name: str, variants: Sequence[str], cfg: Config) -> dict[str, Any]:
    """CPU: peak RSS of a fresh process per variant (RSS never goes down, so processes cannot
    be shared); they fork from a server that has imported torch, so each starts in
    milliseconds from the same baseline. CUDA: ``max_memory_allocated`` above what was
    allocated before the model, variant after variant in this process."""
    out: dict[str, Any] = {}
    available = [name for name in variants if not make_variant(name).unavailable()]
    if cfg.device == "cuda":
        # The peak counter resets, so one process serves every variant (a CUDA context per
        # process would cost seconds each).
        for name in available:
            try:
                out[name] = _memory_probe(model_name, name, cfg)
            except Exception as exc:
                out[name] = {"error": _error(exc)}
            gc.collect()
            torch.cuda.empty_cache()
    else:
        ctx = multiprocessing.get_context("forkserver")
        preload = ["torch", "torch_sentinel", "benchmarks.models", "benchmarks.variants"]
        ctx.set_forkserver_preload(preload)
        with ctx.Pool(1, maxtasksperchild=1) as pool:
            for name in available:
                try:
                    job = pool.apply_async(_memory_probe, (model_name, name, cfg))
                    out[name] = job.get(timeout=600)
                except Exception as exc:
                    out[name] = {"error": _error(exc)}
    bare = out.get("bare", {}).get("peak_mb")
    if bare is not None:
        for entry in out.values():
            if "peak_mb" in entry:
                entry["delta_mb"] = entry["peak_mb"] - bare
    return out


# ---------------------------------------------------------------------------------- paired
PAIRED_MIN_STEPS = 20


def bench_paired(cfg: Config, device: torch.device, workroot: str) -> dict[str, Any]:
    """The sentinel default against the bare loop, in a long run's steady state, with the finest
    interleaving there is: one step of each, alternating which goes first, after both are past
    the sentinel's denser sampling of the first 100 steps.

    Rounds of many steps (``bench_model``) compare every variant at once, but a round on a
    small step is a few dozen steps, so one detector window or a burst of machine noise moves a
    round's ratio by 10-40%; adjacent steps share the machine's state. Reported: the median of
    the per-step ratios with its interquartile range, and the total-time ratio, which spreads
    the sampled steps and the detector windows over the steps that do not have them.
    """
    out: dict[str, Any] = {}
    timer = Timer(device)
    names = ("bare", SENTINEL)
    for model_name in cfg.models:
        contestants: dict[str, Contestant] = {}
        try:
            for name in names:
                torch.manual_seed(0)
                workdir = os.path.join(workroot, f"paired-{model_name}-{name}")
                os.makedirs(workdir, exist_ok=True)
                c = contestants[name] = Contestant(
                    bench_models.build(model_name, device, cfg.tiny), make_variant(name), workdir
                )
                c.run(max(cfg.warmup, cfg.sentinel_warmup))
            per_pair = timer.time(contestants["bare"].step) + timer.time(contestants[SENTINEL].step)
            steps = max(PAIRED_MIN_STEPS,
                        min(cfg.paired_max_steps, round(cfg.paired_seconds / max(per_pair, 1e-6))))
            times: dict[str, list[float]] = {n: [] for n in names}
            gc.collect()
            for i in range(steps):
                for name in names if i % 2 == 0 else names[::-1]:
                    times[name].append(timer.time(contestants[name].step))
        finally:
            for c in contestants.values():
                with contextlib.suppress(Exception):
                    c.close()
        ratios = sorted(s / b for s, b in zip(times[SENTINEL], times["bare"]))
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        out[model_name] = {
            "steps": steps,
            "first_step": contestants[SENTINEL].steps - steps,
            "bare_ms": statistics.median(times["bare"]) * 1e3,
            "sentinel_ms": statistics.median(times[SENTINEL]) * 1e3,
            "ratio_median": statistics.median(ratios),
            "ratio_q1": q1,
            "ratio_q3": q3,
            "ratio_total": sum(times[SENTINEL]) / sum(times["bare"]),
        }
    return out


# ---------------------------------------------------------------------------------- scaling
def bench_scaling(cfg: Config, device: torch.device, workroot: str) -> dict[str, Any]:
    """Overhead as the module count grows: if per-hook Python cost dominated, the ratio would
    grow with the count even though each module does little work."""
    out: dict[str, Any] = {}
    for n in cfg.scaling:
        contestants: dict[str, Contestant] = {}
        for name in SCALING_VARIANTS:
            torch.manual_seed(0)
            workload = bench_models.deep_stack(device, n, batch=8 if cfg.tiny else 32)
            workdir = os.path.join(workroot, f"scaling{n}-{name}")
            os.makedirs(workdir, exist_ok=True)
            contestants[name] = Contestant(workload, make_variant(name), workdir)
            # Past the sentinel's first ten steps, which all sample everything: with one step
            # per round at 1,000 modules, a 3-step warm-up timed only those.
            contestants[name].run(max(cfg.warmup, SCALING_WARMUP))
        try:
            steps = _steps_per_round(contestants["bare"], device, cfg)
            per_step = _time_rounds(contestants, device, cfg.scaling_rounds, steps)
        finally:
            for c in contestants.values():
                c.close()
        summary = summarize(per_step)
        bare_ms = summary["bare"]["median_ms"]
        for entry in summary.values():
            entry["added_us_per_module"] = (entry["median_ms"] - bare_ms) * 1e3 / n
        out[str(n)] = summary
    return out


# ---------------------------------------------------------------------------------- targets
def check_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    cuda = results["meta"]["device"] == "cuda"
    checks: list[dict[str, Any]] = []

    def add(what: str, value: Optional[float], limit: float, ok: Optional[bool]) -> None:
        checks.append({"target": what, "value": value, "limit": limit, "met": ok})

    for mode, per_model in results["timing"].items():
        limit = (1.01 if mode == "compiled" else 1.03) if cuda else 1.05
        for model, r in per_model.items():
            v = r["variants"]
            s = v.get(SENTINEL)
            if s is None:
                continue
            add(
                f"{mode} {model}: sentinel default / bare <= {limit}",
                s["ratio_median"],
                limit,
                s["ratio_median"] <= limit,
            )
            if not cuda and mode == "eager":
                for alt in ("detect_anomaly", "naive_hooks"):
                    if alt in v:
                        x = v[alt]["vs_sentinel_median"]
                        add(f"{model}: {alt} / sentinel default >= 1.25", x, 1.25, x >= 1.25)
            for name, entry in r["sync_audit"].items():
                if name == "bare":
                    continue
                added = entry.get("added_host_reads_per_step")
                if added is not None and (name == "sentinel_deferred" or cuda):
                    what = f"{mode} {model}: {name} added host reads per step == 0"
                    add(what, added, 0, added == 0)
                if cuda:
                    ok = entry.get("cuda_sync_error_mode") == "ok"
                    add(
                        f"{mode} {model}: {name} under set_sync_debug_mode('error')",
                        0 if ok else 1,
                        0,
                        ok,
                    )
    if not cuda:
        for model, e in results.get("paired", {}).items():
            add(f"paired steady state {model}: sentinel default total-time ratio <= 1.05",
                e["ratio_total"], 1.05, e["ratio_total"] <= 1.05)
    return checks


# ---------------------------------------------------------------------------------- report
def _machine(device: torch.device) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    meta = {
        "device": device.type,
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(device)
        meta["cuda"] = torch.version.cuda
    return meta


def _ratio_cell(e: dict[str, Any]) -> str:
    return f"{e['ratio_median']:.2f}{X} ({e['ratio_min']:.2f}{DASH}{e['ratio_max']:.2f}), mean {e['ratio_mean']:.2f}{X}"


def to_markdown(results: dict[str, Any]) -> str:
    from .variants import VARIANTS

    meta = results["meta"]
    where = (
        meta.get("gpu")
        or f"{meta['cpu']}, {meta['cpu_count']} cores, {meta['torch_threads']} torch threads"
    )
    lines = [
        f"## Training-step overhead on {meta['device']}: {where}",
        "",
        f"torch {meta['torch']}, Python {meta['python']}, {meta['date']}. Command: `{meta['command']}`",
        "",
        "Each cell: median over rounds of (variant step time / bare step time in the same round), "
        f"min{DASH}max in brackets, then the total-time ratio (which includes the sentinel's detector window every 10 steps). "
        "Variants are interleaved and the order rotates each round. The sentinel variants were warmed up for "
        f"{meta.get('config', {}).get('sentinel_warmup', 0)} steps (steady state past the first 100 steps' sampling).",
    ]
    for mode, per_model in results["timing"].items():
        names = list(per_model)
        lines += [
            "",
            f"### {mode}",
            "",
            "| variant | " + " | ".join(names) + " |",
            "|---" * (len(names) + 1) + "|",
        ]
        lines.append(
            "| bare, ms/step | "
            + " | ".join(f"{per_model[m]['variants']['bare']['median_ms']:.1f}" for m in names)
            + " |"
        )
        all_variants = list(
            dict.fromkeys(
                v for m in names for v in [*per_model[m]["variants"], *per_model[m]["skipped"]]
            )
        )
        for v in all_variants:
            if v == "bare":
                continue
            cells = []
            for m in names:
                r = per_model[m]
                if v in r["variants"]:
                    cells.append(_ratio_cell(r["variants"][v]))
                else:
                    cells.append(f"skipped: {r['skipped'].get(v, 'not run')}")
            label = VARIANTS[v].label if v in VARIANTS else v
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "Alternatives side by side with the sentinel default (median of per-round ratios):",
            "",
            "| variant | " + " | ".join(names) + " |",
            "|---" * (len(names) + 1) + "|",
        ]
        for v in all_variants:
            if v in ("bare", SENTINEL):
                continue
            cells = [
                f"{per_model[m]['variants'][v]['vs_sentinel_median']:.2f}{X}"
                if "vs_sentinel_median" in per_model[m]["variants"].get(v, {})
                else DASH
                for m in names
            ]
            lines.append(f"| {v} / sentinel | " + " | ".join(cells) + " |")
        lines += [
            "",
            "Sync audit (steps without a flush; host reads counted at the dispatcher, added over bare):",
            "",
            "| model | variant | added host reads/step | CUDA sync_debug_mode='error' |",
            "|---|---|---|---|",
        ]
        for m in names:
            for v, e in per_model[m]["sync_audit"].items():
                reads = e.get("added_host_reads_per_step")
                lines.append(
                    f"| {m} | {v} | {DASH if reads is None else f'{reads:g}'} | {e.get('cuda_sync_error_mode', 'n/a (CPU)')} |"
                )
    if results.get("memory"):
        unit = "peak allocated MB" if meta["device"] == "cuda" else "peak RSS MB"
        names = list(results["memory"])
        lines += [
            "",
            f"### Memory ({unit}, Δ vs bare)",
            "",
            "| variant | " + " | ".join(names) + " |",
            "|---" * (len(names) + 1) + "|",
        ]
        variants = list(dict.fromkeys(v for m in names for v in results["memory"][m]))
        for v in variants:
            cells = []
            for m in names:
                e = results["memory"][m].get(v, {})
                cells.append(
                    f"{e['peak_mb']:.0f} ({e.get('delta_mb', 0):+.0f})"
                    if "peak_mb" in e
                    else e.get("error", DASH)
                )
            lines.append(f"| {v} | " + " | ".join(cells) + " |")
    if results.get("paired"):
        lines += [
            "",
            "### Steady state, paired (bare and sentinel default alternating step by step, past step 100)",
            "",
            "| model | bare ms/step | sentinel ms/step | median per-step ratio (IQR) | total-time ratio | steps |",
            "|---|---|---|---|---|---|",
        ]
        for m, e in results["paired"].items():
            lines.append(
                f"| {m} | {e['bare_ms']:.2f} | {e['sentinel_ms']:.2f} | {e['ratio_median']:.3f}{X} "
                f"({e['ratio_q1']:.2f}{DASH}{e['ratio_q3']:.2f}) | {e['ratio_total']:.3f}{X} | "
                f"{e['first_step']}{DASH}{e['first_step'] + e['steps'] - 1} |"
            )
    if results.get("scaling"):
        lines += [
            "",
            "### Scaling with module count (Linear 64 / Tanh stack, orthogonal init, batch 32)",
            "",
            "| modules | bare ms/step | "
            + " | ".join(f"{v} ratio (µs/module)" for v in SCALING_VARIANTS[1:])
            + " |",
            "|---" * (len(SCALING_VARIANTS) + 1) + "|",
        ]
        for n, s in results["scaling"].items():
            cells = [
                f"{s[v]['ratio_median']:.2f}{X} ({s[v]['added_us_per_module']:.1f})"
                for v in SCALING_VARIANTS[1:]
                if v in s
            ]
            lines.append(f"| {n} | {s['bare']['median_ms']:.2f} | " + " | ".join(cells) + " |")
    if results.get("targets"):
        lines += ["", "### Targets", "", "| target | value | met |", "|---|---|---|"]
        for t in results["targets"]:
            value = DASH if t["value"] is None else f"{t['value']:.3g}"
            lines.append(f"| {t['target']} | {value} | {'yes' if t['met'] else 'NO'} |")
    for note in results.get("notes", []):
        lines += ["", f"- {note}"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- driver
def run(cfg: Config) -> dict[str, Any]:
    device = torch.device(cfg.device)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda was asked for, but torch.cuda.is_available() is False")
    if device.type == "cuda":
        # What fp32 training on a recent GPU runs with; without it matmuls dominate so much
        # that every overhead would look small.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    deadline = Deadline(cfg.budget_s)
    results: dict[str, Any] = {
        "meta": {**_machine(device), "command": cfg.command, "config": dataclasses.asdict(cfg)},
        "timing": {},
        "memory": {},
        "scaling": {},
        "paired": {},
        "notes": [],
    }
    if cfg.compile:
        # Each variant's hooks must be guarded, or a compiled graph of a hook-less copy of the
        # same class is reused for the hooked ones, and their hooks silently never run.
        torch._dynamo.config.skip_nnmodule_hook_guards = False
        torch._dynamo.config.recompile_limit = 64
        torch._dynamo.config.accumulated_recompile_limit = 1024
    workroot = tempfile.mkdtemp(prefix="sentinel-bench-")
    try:
        for mode in ["eager", *(["compiled"] if cfg.compile else [])]:
            for model_name in cfg.models:
                if deadline.passed():
                    results["notes"].append(f"{mode} {model_name}: skipped, time budget spent")
                    continue
                print(f"[{mode}] {model_name} ...", file=sys.stderr, flush=True)
                t0 = time.monotonic()
                r = bench_model(model_name, cfg, device, workroot, compiled=mode == "compiled")
                r["seconds"] = time.monotonic() - t0
                results["timing"].setdefault(mode, {})[model_name] = r
                _print_model(mode, model_name, r)
        if cfg.memory:
            for model_name in cfg.models:
                if deadline.passed():
                    results["notes"].append(f"memory {model_name}: skipped, time budget spent")
                    continue
                print(f"[memory] {model_name} ...", file=sys.stderr, flush=True)
                t0 = time.monotonic()
                variants = cfg.memory_variants or cfg.variants
                results["memory"][model_name] = bench_memory(model_name, variants, cfg)
                print(f"  {time.monotonic() - t0:.1f} s", file=sys.stderr)
        if cfg.paired_seconds > 0 and not cfg.compile and not deadline.passed():
            print("[paired] ...", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            results["paired"] = bench_paired(cfg, device, workroot)
            for m, e in results["paired"].items():
                print(f"  paired   {m:12s} {e['bare_ms']:9.2f} ms  sentinel {e['ratio_median']:.3f}{X} "
                      f"(IQR {e['ratio_q1']:.2f}{DASH}{e['ratio_q3']:.2f}), total {e['ratio_total']:.3f}{X}, "
                      f"{e['steps']} steps", file=sys.stderr)
            print(f"  {time.monotonic() - t0:.1f} s", file=sys.stderr)
        if cfg.scaling and not deadline.passed():
            print("[scaling] ...", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            results["scaling"] = bench_scaling(cfg, device, workroot)
            print(f"  {time.monotonic() - t0:.1f} s", file=sys.stderr)
    finally:
        shutil.rmtree(workroot, ignore_errors=True)
    results["targets"] = check_targets(results)
    return results


def _print_model(mode: str, model_name: str, r: dict[str, Any]) -> None:
    print(f"  {r['seconds']:.1f} s, {r['steps_per_round']} steps per round", file=sys.stderr)
    for name, e in r["variants"].items():
        print(
            f"  {mode:8s} {model_name:12s} {name:18s} {e['median_ms']:9.2f} ms  {_ratio_cell(e)}",
            file=sys.stderr,
        )


def write(results: dict[str, Any], out: str) -> tuple[str, str]:
    os.makedirs(out, exist_ok=True)
    stem = os.path.join(out, f"overhead-{results['meta']['device']}")
    with open(stem + ".json", "w") as f:
        json.dump(results, f, indent=1, default=str)
    with open(stem + ".md", "w") as f:
        f.write(to_markdown(results))
    return stem + ".json", stem + ".md"


def _csv(s: str) -> list[str]:
    return [x for x in s.split(",") if x]


def parse(argv: Optional[Sequence[str]] = None) -> tuple[Config, argparse.Namespace]:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.overhead",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument(
        "--models", type=_csv, help="comma-separated; default mlp,cnn,transformer (+gpt on cuda)"
    )
    p.add_argument("--variants", type=_csv, default=DEFAULT_VARIANTS)
    p.add_argument("--rounds", type=int, default=Config.rounds)
    p.add_argument(
        "--round-seconds",
        type=float,
        default=None,
        help="time the bare loop spends per round, which sets the steps per round "
        "(default: 0.5 s; 0.15 s on cuda)",
    )
    p.add_argument("--warmup", type=int, default=Config.warmup)
    p.add_argument("--sentinel-warmup", type=int, default=Config.sentinel_warmup,
                   help="warm-up steps of the sentinel variants (default: past the first 100 steps' sampling)")
    p.add_argument("--audit-steps", type=int, default=Config.audit_steps)
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also time under torch.compile (default: on for cuda)",
    )
    p.add_argument("--compile-variants", type=_csv, default=list(COMPILE_VARIANTS))
    p.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--memory-steps", type=int, default=Config.memory_steps)
    p.add_argument("--memory-variants", type=_csv, default=[], help="default: all of --variants")
    p.add_argument(
        "--scaling",
        type=lambda s: [int(x) for x in _csv(s)],
        default=list(Config.scaling),
        help="module counts, comma-separated; empty to skip",
    )
    p.add_argument("--scaling-rounds", type=int, default=Config.scaling_rounds)
    p.add_argument("--paired-seconds", type=float, default=Config.paired_seconds,
                   help="seconds per model of the paired steady-state run (0: skip it)")
    p.add_argument(
        "--threads", type=int, default=0, help="torch.set_num_threads (default: torch's choice)"
    )
    p.add_argument(
        "--tiny", action="store_true", help="tiny models (smoke test; figures meaningless)"
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=0.0,
        help="stop starting new sections after this many seconds (default: none; 420 on cuda)",
    )
    p.add_argument("--out", default=RESULTS_DIR)
    p.add_argument("--note", action="append", default=[], help="a line for the results' notes")
    a = p.parse_args(argv)
    cuda = a.device == "cuda"
    if a.round_seconds is None:
        a.round_seconds = 0.15 if cuda else Config.round_seconds
    if cuda and a.budget_s == 0.0:
        a.budget_s = 420.0  # a short GPU slot: stop starting sections after 7 minutes
    unknown = sorted(set(a.variants) | set(a.memory_variants) | set(a.compile_variants))
    unknown = sorted(set(unknown) - set(DEFAULT_VARIANTS))
    if unknown:
        p.error(
            f"unknown variant(s) {', '.join(unknown)}; expected some of {', '.join(DEFAULT_VARIANTS)}"
        )
    models = a.models or list(bench_models.GPU_MODELS if cuda else bench_models.CPU_MODELS)
    unknown = sorted(set(models) - set(bench_models.GPU_MODELS))
    if unknown:
        p.error(
            f"unknown model(s) {', '.join(unknown)}; expected some of {', '.join(bench_models.GPU_MODELS)}"
        )
    cfg = Config(
        device=a.device,
        models=models,
        variants=a.variants,
        rounds=a.rounds,
        round_seconds=a.round_seconds,
        warmup=a.warmup,
        sentinel_warmup=a.sentinel_warmup,
        audit_steps=a.audit_steps,
        compile=cuda if a.compile is None else a.compile,
        compile_variants=a.compile_variants,
        memory=a.memory,
        memory_steps=a.memory_steps,
        memory_variants=a.memory_variants,
        scaling=a.scaling,
        scaling_rounds=a.scaling_rounds,
        paired_seconds=a.paired_seconds,
        tiny=a.tiny,
        threads=a.threads,
        budget_s=a.budget_s,
        out=a.out,
        command="python -m benchmarks.overhead "
        + " ".join(argv if argv is not None else sys.argv[1:]),
    )
    return cfg, a


def main(argv: Optional[Sequence[str]] = None) -> int:
    warnings.filterwarnings(
        "ignore", module="torch_sentinel"
    )  # its findings on random data are not timed
    cfg, a = parse(argv)
    results = run(cfg)
    results["notes"] += a.note
    json_path, md_path = write(results, cfg.out)
    print(to_markdown(results))
    print(f"wrote {json_path} and {md_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
