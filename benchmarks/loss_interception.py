"""How the loss calls are intercepted, and what each way costs: host time per step and launches.

The loss contracts need every loss call's inputs, keywords and call site. Three ways were
weighed (``_collect/loss_inputs.py`` says why the patches won); this measures them on a step
small enough for host costs to show:

- ``patch_wrapper``: one shared function patch per ``F.*`` loss with a listener that does
  nothing: the per-call price of the wrapper itself;
- ``global_forward_hook``: ``torch.nn.modules.module.register_module_forward_hook`` with an
  empty hook (sees ``nn.*Loss`` modules only): every module of the process leaves
  ``nn.Module``'s hook-free fast path;
- ``graph_read``: at each ``backward()``, a walk from the loss's node to the loss function's
  node and a read of its saved input and target (``_saved_self``, ``_saved_target``), with the
  same device figures on sampled steps: no patch, but only losses with a node of their own;
- ``sentinel_no_contracts``: ``attach()`` with the loss-side kinds (and ``plateau``, which
  shares their probe) disabled: the sentinel without the loss calls observed;
- ``sentinel``: ``attach()`` as shipped by this branch;
- ``sentinel@<dir>``: the sentinel of another checkout (``--baseline``, default ``/work/main``),
  to show the default overhead did not regress.

Each variant runs in its own process (the patches are process-wide), ``--rounds`` times, the
order rotating; a run warms up past step 100 (a long run's steady state: one sampled step in
fifty) and times ``--steps`` steps in thread CPU time (preemption by other processes does not
count). Reported: the median over rounds of the median step and of the mean step (the mean
spreads sampled steps and detector windows), and launching ops per step over steps 100-149 and
0-9 (all sampled) counted at the dispatcher, minus the bare loop's.

    python -m benchmarks.loss_interception [--rounds 5] [--steps 300] [--baseline /work/main]
                                           [--models mlp stack100] [--variants bare sentinel ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

VARIANTS = ("bare", "patch_wrapper", "global_forward_hook", "graph_read", "sentinel_no_contracts", "sentinel")
LOSS_KINDS = {"probabilities_as_logits", "loss_broadcast", "invalid_loss_input", "invalid_target", "plateau"}


def _model(name: str) -> tuple[nn.Module, Callable[[nn.Module, int], torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    if name == "mlp":
        model: nn.Module = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
        xs = [torch.randn(32, 64, generator=g) for _ in range(4)]
        ys = [torch.randint(0, 10, (32,), generator=g) for _ in range(4)]
        return model, lambda m, i: F.cross_entropy(m(xs[i % 4]), ys[i % 4])
    model = nn.Sequential(*[nn.Linear(16, 16) if i % 2 == 0 else nn.Tanh() for i in range(100)])
    xs = [torch.randn(8, 16, generator=g) for _ in range(4)]
    return model, lambda m, i: F.mse_loss(m(xs[i % 4]), xs[(i + 1) % 4])


class _Nothing:
    def before(self, args: Any, kwargs: Any) -> None:
        return None

    def after(self, args: Any, kwargs: Any, result: Any) -> None:
        return None


_LOSS_NODES = {"NllLossBackward0", "MseLossBackward0", "BinaryCrossEntropyWithLogitsBackward0"}


def _graph_read(loss: torch.Tensor, step: int) -> None:
    """Option (b): find the loss function's node below the loss, read what it saved."""
    from torch_sentinel._collect.cadence import sampled
    from torch_sentinel.losses import checks

    frontier, seen = [loss.grad_fn], 0
    while frontier and seen < 64:
        node = frontier.pop(0)
        if node is None:
            continue
        seen += 1
        if type(node).__name__ in _LOSS_NODES:
            x, t = node._saved_self, node._saved_target
            if sampled(step, 5, 10):  # what the contracts measure of an nll/MSE input and target
                with torch.no_grad():
                    r = checks.rows(x, 1 if x.ndim > 1 else 0)
                    checks.probabilities(r)
                    checks.log_probabilities(r, checks.tolerance(x.dtype))
                    checks.values(checks.rows(t.float(), -1))
            return
        frontier.extend(n for n, _ in node.next_functions)


def worker(variant: str, model_name: str, steps: int, warm: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, loss_at = _model(model_name)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    handle = None
    if variant == "patch_wrapper":
        from torch_sentinel._collect.patches import patch_for

        for name in ("cross_entropy", "mse_loss"):
            patch_for(F, name).add(_Nothing())
    elif variant == "global_forward_hook":
        handle = nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
    elif variant.startswith("sentinel"):
        import torch_sentinel

        disable = LOSS_KINDS if variant == "sentinel_no_contracts" else set()
        torch_sentinel.attach(model, opt, disable=disable)

    def step(i: int) -> None:
        opt.zero_grad()
        loss = loss_at(model, i)
        if variant == "graph_read":
            _graph_read(loss, i)
        loss.backward()
        opt.step()

    from torch_sentinel.testing import count_launches

    times: list[float] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with count_launches() as early:
            for i in range(10):
                step(i)
        for i in range(10, warm):
            step(i)
        for i in range(warm, warm + steps):
            t0 = time.thread_time_ns()
            step(i)
            times.append((time.thread_time_ns() - t0) / 1e3)
        with count_launches() as late:
            for i in range(warm + steps, warm + steps + 50):
                step(i)
    if handle is not None:
        handle.remove()
    return {"median_us": statistics.median(times), "mean_us": statistics.fmean(times),
            "launches_0_9": early.count / 10, "launches_late": late.count / 50}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warm", type=int, default=110)
    ap.add_argument("--baseline", default="/work/main")
    ap.add_argument("--models", nargs="*", default=["mlp", "stack100"])
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--worker", nargs=2, metavar=("VARIANT", "MODEL"))
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker[0], a.worker[1], a.steps, a.warm)))
        return
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runs = [(v, here) for v in a.variants]
    if a.baseline and os.path.isdir(a.baseline):
        runs.append((f"sentinel@{a.baseline}", a.baseline))
    for model_name in a.models:
        results: dict[str, list[dict[str, Any]]] = {v: [] for v, _ in runs}
        for r in range(a.rounds):
            order = runs[r % len(runs):] + runs[: r % len(runs)]
            for variant, path in order:
                # Run by path from outside both checkouts: ``-m`` would put the working directory
                # first on sys.path, and the baseline would import this checkout's package.
                env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
                kind = "sentinel" if variant.startswith("sentinel@") else variant
                out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", kind,
                                      model_name, "--steps", str(a.steps), "--warm", str(a.warm)],
                                     env=env, capture_output=True, text=True, cwd=tempfile.gettempdir(), check=True)
                results[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
        bare = results["bare"]
        b_med = statistics.median(r["median_us"] for r in bare)
        b_mean = statistics.median(r["mean_us"] for r in bare)
        print(f"\n{model_name}: {a.rounds} rounds of {a.steps} steps past step {a.warm}, thread CPU time")
        print("| variant | median step, us | x bare | mean step, us | x bare | added launches/step, steps 0-9 | added, steps past 100 |")
        print("|---|---|---|---|---|---|---|")
        for variant, _ in runs:
            rs = results[variant]
            med = statistics.median(r["median_us"] for r in rs)
            mean = statistics.median(r["mean_us"] for r in rs)
            early = statistics.median(r["launches_0_9"] for r in rs) - statistics.median(r["launches_0_9"] for r in bare)
            late = statistics.median(r["launches_late"] for r in rs) - statistics.median(r["launches_late"] for r in bare)
            print(f"| {variant} | {med:.0f} | {med / b_med:.3f} | {mean:.0f} | {mean / b_mean:.3f} | {early:.1f} | {late:.2f} |")


if __name__ == "__main__":
    main()
