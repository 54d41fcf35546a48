"""One command that checks the sentinel's GPU promises; without CUDA it runs its CPU half.

    python -m benchmarks.gpu_check              # CUDA if available, else the CPU half
    python -m benchmarks.gpu_check --tiny       # tiny models (the test suite runs this)

On CUDA, for a GPT-2-small-shaped LM and the benchmark CNN, eager and ``torch.compile``:

- **sync audit**: the bare and the instrumented steps run under
  ``torch.cuda.set_sync_debug_mode("error")``, where any synchronising call raises;
- **overhead**: the step time against the bare step, timed with CUDA events over interleaved
  rounds (each round runs bare and sentinel for the same steps, the order alternating; the
  ratio is taken within each round, so drift cancels);
- **kernel launches** per step, counted with ``torch.profiler`` (runtime launch calls), and the
  launching ops added per module per step, counted at the dispatcher (eager);
- **the exact NaN step** in deferred mode: a NaN injected at a known step and module must be
  reported at that step, naming that module.

Without CUDA (the CPU half): launching ops per module per step with a dispatch mode
(:func:`torch_sentinel.testing.count_launches`), the sync audit with
:func:`torch_sentinel.testing.count_host_syncs`, and the NaN step, eager. No timing.

Writes ``<out>/gpu_check-<device>.json`` and ``.md`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any, Callable, Optional

import torch
from torch import nn

import torch_sentinel
from torch_sentinel import NonFiniteError
from torch_sentinel.testing import count_host_syncs, count_launches, cuda_sync_guard

from . import models as bench_models

__all__ = ["Config", "main", "run"]

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
#: The module a NaN is injected into, per model: a layer in the middle of the network.
NAN_MODULE = {"gpt2s": "blocks.1.fc", "gpt": "blocks.1.fc", "cnn": "4", "mlp": "3", "transformer": "head"}
VARIANTS = ("bare", "sentinel", "sentinel_deferred")


@dataclasses.dataclass
class Config:
    device: str = "auto"
    models: Sequence[str] = ("gpt2s", "cnn")
    tiny: bool = False
    compile: bool = True
    warmup: int = 3
    #: Steps counted for launches and the sync audit: 20 covers two of the sampled steps (every 10th).
    steps: int = 20
    rounds: int = 10
    round_steps: int = 5
    timing: Optional[bool] = None  # default: on CUDA only
    nan_step: int = 4
    out: str = RESULTS_DIR
    #: torch.compile's backend for the compiled half.
    backend: str = "inductor"
    #: Run the compiled half on CPU too (no timing there): the test suite checks its logic so.
    compiled_on_cpu: bool = False


class Run:
    """One copy of a workload trained under one variant, eager or compiled."""

    def __init__(self, model_name: str, variant: str, device: torch.device, cfg: Config, compiled: bool) -> None:
        self.workload = bench_models.build(model_name, device, cfg.tiny)
        self.model = self.workload.model
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.sentinel: Optional[torch_sentinel.Sentinel] = None
        if variant != "bare":
            check = "deferred" if variant == "sentinel_deferred" else "auto"
            self.sentinel = torch_sentinel.attach(self.model, self.optimizer, check=check, flush_every=1000)
        self.forward: Callable[..., Any] = torch.compile(self.model, backend=cfg.backend) if compiled else self.model
        self.modules = sum(1 for _ in self.model.modules())
        self.steps = 0

    def step(self) -> None:
        x, y = self.workload.batch(self.steps)
        self.optimizer.zero_grad(set_to_none=True)
        self.workload.loss_fn(self.forward(x), y).backward()
        self.optimizer.step()
        self.steps += 1

    def run(self, n: int) -> None:
        for _ in range(n):
            self.step()

    def quiesce(self) -> None:
        """Hand pending rows to the host outside any audited region (a flush is cold path)."""
        if self.sentinel is not None:
            self.sentinel.flush()

    def close(self) -> None:
        if self.sentinel is not None:
            self.sentinel.detach()


def _error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


# ---------------------------------------------------------------------------------- launches
def dispatch_launches(runs: dict[str, Run], steps: int) -> dict[str, Any]:
    """Launching ops per step at the dispatcher (views, detach, allocations excluded); eager."""
    out: dict[str, Any] = {}
    for name, r in runs.items():
        r.quiesce()
        with count_launches() as c:
            r.run(steps)
        out[name] = {"per_step": c.count / steps, "top_ops": dict(c.ops.most_common(8))}
    bare = out["bare"]["per_step"]
    modules = runs["bare"].modules
    for entry in out.values():
        entry["added_per_step"] = entry["per_step"] - bare
        entry["added_per_module_per_step"] = entry["added_per_step"] / modules
    return {"modules": modules, "variants": out}


def is_launch(key: str) -> bool:
    """A profiler event that is a kernel launch call (CUDA runtime or driver API)."""
    return "LaunchKernel" in key or "LaunchCooperativeKernel" in key


def profiler_launches(runs: dict[str, Run], steps: int) -> dict[str, Any]:
    """CUDA kernel launches per step, from the runtime/driver launch calls the profiler records
    (covers compiled graphs, which a dispatch mode cannot see into)."""
    from torch.profiler import ProfilerActivity, profile

    out: dict[str, Any] = {}
    for name, r in runs.items():
        r.quiesce()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            r.run(steps)
            torch.cuda.synchronize()
        events = prof.key_averages()
        launches = sum(e.count for e in events if is_launch(e.key))
        copies = sum(e.count for e in events if "Memcpy" in e.key or "Memset" in e.key)
        out[name] = {"launches_per_step": launches / steps, "memcpy_memset_per_step": copies / steps}
    bare = out["bare"]["launches_per_step"]
    for entry in out.values():
        entry["added_launches_per_step"] = entry["launches_per_step"] - bare
        entry["added_per_module_per_step"] = entry["added_launches_per_step"] / runs["bare"].modules
    return out


# ---------------------------------------------------------------------------------- sync audit
def sync_audit(runs: dict[str, Run], steps: int, compiled: bool, cuda: bool) -> dict[str, Any]:
    """Host reads per step counted at the dispatcher (eager only: a dispatch mode would send a
    compiled graph back to eager), and on CUDA the steps under set_sync_debug_mode("error")."""
    out: dict[str, Any] = {}
    for name, r in runs.items():
        entry: dict[str, Any] = {}
        if not compiled:
            r.quiesce()
            with count_host_syncs() as syncs:
                r.run(steps)
            entry["host_reads_per_step"] = syncs.count / steps
            entry["host_read_ops"] = dict(syncs.ops)
        if cuda:
            r.quiesce()
            torch.cuda.synchronize()
            try:
                with cuda_sync_guard("error"):
                    r.run(steps)
                entry["cuda_sync_error_mode"] = "ok"
            except RuntimeError as exc:
                entry["cuda_sync_error_mode"] = _error(exc)
        out[name] = entry
    bare = out["bare"].get("host_reads_per_step")
    if bare is not None:
        for entry in out.values():
            entry["added_host_reads_per_step"] = entry["host_reads_per_step"] - bare
    return out


# ---------------------------------------------------------------------------------- timing
def overhead(runs: dict[str, Run], rounds: int, steps: int, cuda: bool) -> dict[str, Any]:
    """Interleaved rounds; the per-round ratio to bare, its median and range (CUDA events)."""
    per_step: dict[str, list[float]] = {n: [] for n in runs}
    names = list(runs)
    for k in range(rounds):
        order = names if k % 2 == 0 else names[::-1]
        for name in order:
            r = runs[name]
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                r.run(steps)
                end.record()
                end.synchronize()  # after the timed region
                seconds = start.elapsed_time(end) / 1e3
            else:
                t0 = time.perf_counter()
                r.run(steps)
                seconds = time.perf_counter() - t0
            per_step[name].append(seconds / steps)
    out: dict[str, Any] = {}
    for name, times in per_step.items():
        ratios = [t / b for t, b in zip(times, per_step["bare"])]
        out[name] = {
            "median_ms": statistics.median(times) * 1e3,
            "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
        }
    return out


# ---------------------------------------------------------------------------------- NaN step
def nan_step(model_name: str, device: torch.device, cfg: Config, compiled: bool) -> dict[str, Any]:
    """Deferred mode: a fault injected at a known step must be reported at that step.

    Eager: module ``NAN_MODULE`` emits a NaN at step ``nan_step`` (a forward hook registered
    before attach, the NaN added on the device, no host read). Compiled: a NaN written into that
    module's weight before step ``nan_step`` (a Python counter in a hook would recompile), which
    must be charged to the update of the step before.
    """
    module = NAN_MODULE[model_name]
    at = cfg.nan_step
    w = bench_models.build(model_name, device, cfg.tiny)
    model = w.model
    target = model.get_submodule(module)
    calls = [0]
    poison = torch.full((), math.nan, device=device)
    if not compiled:
        def spike(m: nn.Module, args: Any, out: torch.Tensor) -> Optional[torch.Tensor]:
            calls[0] += 1
            return out + poison if calls[0] - 1 == at else None

        target.register_forward_hook(spike)
        expected = {"step": at, "boundary": "forward", "module": module}
    else:
        expected = {"step": at - 1, "boundary": "updates", "module": module}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    s = torch_sentinel.attach(model, opt, check="deferred")
    forward = torch.compile(model, backend=cfg.backend) if compiled else model
    found: dict[str, Any] = {"error": None}
    try:
        for step in range(at + 4):
            if compiled and step == at:
                with torch.no_grad():
                    target.weight.view(-1)[0].copy_(poison)
            x, y = w.batch(step)
            opt.zero_grad(set_to_none=True)
            w.loss_fn(forward(x), y).backward()
            opt.step()
        s.detach()
    except NonFiniteError as e:
        found = {"step": e.step, "boundary": e.boundary, "module": e.module, "error": str(e).splitlines()[0]}
    finally:
        s.detach()
    exact = all(found.get(k) == v for k, v in expected.items())
    return {"expected": expected, "found": found, "exact": exact}


# ---------------------------------------------------------------------------------- driver
def _runs(model_name: str, device: torch.device, cfg: Config, compiled: bool) -> dict[str, Run]:
    runs = {}
    for v in VARIANTS:
        runs[v] = Run(model_name, v, device, cfg, compiled)
        runs[v].run(cfg.warmup)
    return runs


def check_model(model_name: str, device: torch.device, cfg: Config, compiled: bool) -> dict[str, Any]:
    cuda = device.type == "cuda"
    runs = _runs(model_name, device, cfg, compiled)
    result: dict[str, Any] = {"model": runs["bare"].workload.description}
    try:
        if not compiled:
            result["dispatch_launches"] = dispatch_launches(runs, cfg.steps)
        if cuda:
            result["profiler_launches"] = profiler_launches(runs, cfg.steps)
        result["sync_audit"] = sync_audit(runs, min(cfg.steps, 5), compiled, cuda)
        if cfg.timing if cfg.timing is not None else cuda:
            result["overhead"] = overhead(runs, cfg.rounds, cfg.round_steps, cuda)
    finally:
        for r in runs.values():
            with contextlib.suppress(Exception):
                r.close()
    result["nan_step"] = nan_step(model_name, device, cfg, compiled)
    return result


def _dynamo_config(**values: Any) -> Any:
    """The dynamo options this torch has, set for the run and restored after it (a caller in
    the same process keeps its own); ``recompile_limit`` was ``cache_size_limit`` before torch
    2.6, and setting an unknown option raises."""
    config = torch._dynamo.config
    return config.patch(**{name: value for name, value in values.items() if hasattr(config, name)})


def run(cfg: Config) -> dict[str, Any]:
    name = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda was asked for, but torch.cuda.is_available() is False")
    device = torch.device(name)
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    modes = ["eager"] + (["compiled"] if cfg.compile and (cuda or cfg.compiled_on_cpu) else [])
    results: dict[str, Any] = {
        "meta": {
            "device": device.type,
            "gpu": torch.cuda.get_device_name(device) if cuda else None,
            "torch": torch.__version__,
            "half": "full (CUDA)" if cuda else "CPU half: launches, sync audit, NaN step; no timing",
            "config": dataclasses.asdict(cfg),
        },
        "checks": {},
    }
    for mode in modes:
        # Every copy of a model class is compiled here (bare first): without hook guards the
        # instrumented copies would reuse the bare graph and their hooks would never run.
        patch = _dynamo_config(skip_nnmodule_hook_guards=False, recompile_limit=64, cache_size_limit=64,
                               accumulated_recompile_limit=1024, accumulated_cache_size_limit=1024)
        with patch if mode == "compiled" else contextlib.nullcontext():
            _check_mode(results, cfg, device, mode)
    results["targets"] = targets(results)
    return results


def _check_mode(results: dict[str, Any], cfg: Config, device: torch.device, mode: str) -> None:
    for model_name in cfg.models:
        print(f"[{mode}] {model_name} ...", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            r = check_model(model_name, device, cfg, compiled=mode == "compiled")
        except Exception as exc:  # one failing section must not cost the others' figures
            r = {"failed": _error(exc)}
        r["seconds"] = round(time.monotonic() - t0, 1)
        results["checks"].setdefault(mode, {})[model_name] = r


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    cuda = results["meta"]["device"] == "cuda"
    out: list[dict[str, Any]] = []
    for mode, per_model in results["checks"].items():
        for model, r in per_model.items():
            if "failed" in r:
                out.append({"target": f"{mode} {model} ran", "met": False, "value": r["failed"]})
                continue
            for name, entry in r["sync_audit"].items():
                if name == "bare":
                    continue
                if "added_host_reads_per_step" in entry and name == "sentinel_deferred":
                    v = entry["added_host_reads_per_step"]
                    out.append({"target": f"{mode} {model}: {name} added host reads == 0", "met": v == 0, "value": v})
                if cuda:
                    ok = entry.get("cuda_sync_error_mode") == "ok"
                    out.append({"target": f"{mode} {model}: {name} under set_sync_debug_mode('error')", "met": ok,
                                "value": entry.get("cuda_sync_error_mode")})
            if "dispatch_launches" in r:
                v = r["dispatch_launches"]["variants"]["sentinel_deferred"]["added_per_module_per_step"]
                out.append({"target": f"{mode} {model}: launching ops added per module per step <= 0.5",
                            "met": v <= 0.5, "value": round(v, 3)})
            if "overhead" in r:
                limit = 1.01 if mode == "compiled" else 1.03
                v = r["overhead"]["sentinel"]["ratio_median"]
                out.append({"target": f"{mode} {model}: sentinel / bare <= {limit}", "met": v <= limit, "value": v})
            n = r["nan_step"]
            out.append({"target": f"{mode} {model}: deferred NaN reported at its exact step and module",
                        "met": n["exact"], "value": n["found"]})
    return out


def to_markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [f"## GPU check on {meta['gpu'] or 'CPU'} (torch {meta['torch']}): {meta['half']}", ""]
    lines += ["| mode | model | modules | launching ops added / module / step (dispatch) | CUDA launches added / step "
              "| host reads added / step | sync-error mode | sentinel / bare | NaN step |",
              "|---|---|---|---|---|---|---|---|---|"]
    for mode, per_model in results["checks"].items():
        for model, r in per_model.items():
            if "failed" in r:
                lines.append(f"| {mode} | {model} | failed: {r['failed']} | | | | | | |")
                continue
            d = r.get("dispatch_launches")
            disp = f"{d['variants']['sentinel_deferred']['added_per_module_per_step']:.2f}" if d else "n/a"
            mods = str(d["modules"]) if d else ""
            p = r.get("profiler_launches")
            prof = f"{p['sentinel_deferred']['added_launches_per_step']:.0f}" if p else "n/a"
            a = r["sync_audit"].get("sentinel_deferred", {})
            reads = f"{a['added_host_reads_per_step']:.1f}" if "added_host_reads_per_step" in a else "n/a"
            mode_err = a.get("cuda_sync_error_mode", "n/a")
            o = r.get("overhead")
            ratio = (f"{o['sentinel']['ratio_median']:.3f} ({o['sentinel']['ratio_min']:.3f}-"
                     f"{o['sentinel']['ratio_max']:.3f})") if o else "n/a"
            n = r["nan_step"]
            nan = f"{'exact' if n['exact'] else 'WRONG'}: step {n['found'].get('step')} {n['found'].get('module')!r}"
            lines.append(f"| {mode} | {model} | {mods} | {disp} | {prof} | {reads} | {mode_err} | {ratio} | {nan} |")
    lines += ["", "### Targets", ""]
    lines += [f"- [{'x' if t['met'] else ' '}] {t['target']}: {t['value']}" for t in results["targets"]]
    return "\n".join(lines) + "\n"


def write(results: dict[str, Any], out: str) -> tuple[str, str]:
    os.makedirs(out, exist_ok=True)
    stem = os.path.join(out, f"gpu_check-{results['meta']['device']}")
    with open(stem + ".json", "w") as f:
        json.dump(results, f, indent=1, default=str)
    with open(stem + ".md", "w") as f:
        f.write(to_markdown(results))
    return stem + ".json", stem + ".md"


def parse(argv: Optional[Sequence[str]] = None) -> Config:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--models", default="gpt2s,cnn", help="comma-separated (default gpt2s,cnn)")
    p.add_argument("--tiny", action="store_true", help="tiny models: the CPU half in seconds")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile half on CUDA")
    p.add_argument("--backend", default="inductor", help="torch.compile backend of the compiled half")
    p.add_argument("--compiled-on-cpu", action="store_true",
                   help="run the compiled half on CPU too (its logic, no timing)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--round-steps", type=int, default=5)
    p.add_argument("--timing", action=argparse.BooleanOptionalAction, default=None,
                   help="time against bare (default: on CUDA only)")
    p.add_argument("--out", default=RESULTS_DIR)
    a = p.parse_args(argv)
    models = [m for m in a.models.split(",") if m]
    unknown = sorted(set(models) - set(bench_models.ALL_MODELS))
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; expected some of {', '.join(bench_models.ALL_MODELS)}")
    return Config(device=a.device, models=models, tiny=a.tiny, compile=not a.no_compile, steps=a.steps,
                  rounds=a.rounds, round_steps=a.round_steps, timing=a.timing, out=a.out,
                  backend=a.backend, compiled_on_cpu=a.compiled_on_cpu)


def main(argv: Optional[Sequence[str]] = None) -> int:
    warnings.filterwarnings("ignore", module="torch_sentinel")
    cfg = parse(argv)
    results = run(cfg)
    json_path, md_path = write(results, cfg.out)
    print(to_markdown(results))
    print(f"wrote {json_path} and {md_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
