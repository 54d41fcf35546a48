"""What the ``loss_spike`` probe costs, interleaved in one process.

    python -m benchmarks.spikes.overhead [--model gpt|mlp] [--steps 300] [--warmup 110] [--clock wall|cpu]

Three copies of one model (same weights, same batches) train in turn, one step each per round,
the order rotating every round: bare, with the sentinel (default detectors, ``loss_spike``
included), and with the sentinel without ``loss_spike`` (``disable={"loss_spike"}``). ``gpt``
is the benchmark GPT (AdamW, clipping, as the injected runs train); ``mlp`` is the overhead
benchmark's MLP (``benchmarks/models.py``: 784-1024-1024-10, batch 256, AdamW), where the
spike probe has no attention or output logits to watch and its ring is all it pays. Past
``--warmup`` steps (the sentinel's sampling is sparse from step 100), each round's step times
are paired; reported: the median of the per-round ratios with their interquartile range, and
the ratio of total times. ``--clock cpu`` times the thread's CPU time (``time.thread_time``,
one intra-op thread) instead of the wall clock: on a shared machine it leaves out the time the
process waited for a core, though not the cache it lost meanwhile. On a shared machine the
figures wander: rerun on a quiet one before quoting them. ``loss_spike`` patches
``F.scaled_dot_product_attention`` process-wide; the two baselines' attention modules call the
function as it was before any attach, so that they do not pay for the patch.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from typing import Any, Callable

import numpy as np
import torch

import torch_sentinel

from .model import GPT, Attention, Config, Corpus, lm_loss, param_groups

VARIANTS = ("bare", "sentinel", "sentinel_without_loss_spike")


def _gpt_loops() -> tuple[str, Callable[[], tuple[torch.nn.Module, torch.optim.Optimizer]], Callable[[int], tuple[Any, Any]], Any]:
    cfg = Config()
    torch.manual_seed(0)
    template = GPT(cfg)
    corpus, g = Corpus(), torch.Generator().manual_seed(0)
    batches = [corpus.batch(g, cfg.batch, cfg.seq) for _ in range(16)]

    def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        model = GPT(cfg)
        model.load_state_dict(template.state_dict())
        opt = torch.optim.AdamW(param_groups(model), lr=cfg.lr, betas=(0.9, cfg.beta2), weight_decay=cfg.weight_decay)
        return model, opt

    return "benchmark GPT (benchmarks/spikes/model.py)", make, lambda i: batches[i % len(batches)], lm_loss


def _mlp_loops() -> tuple[str, Callable[[], tuple[torch.nn.Module, torch.optim.Optimizer]], Callable[[int], tuple[Any, Any]], Any]:
    from benchmarks import models

    template = models.build("mlp", torch.device("cpu"))

    def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        work = models.build("mlp", torch.device("cpu"))
        work.model.load_state_dict(template.model.state_dict())
        return work.model, torch.optim.AdamW(work.model.parameters(), lr=1e-4)

    return template.description, make, template.batch, template.loss_fn


def measure(steps: int, warmup: int, model_name: str = "gpt", clock: str = "wall") -> dict[str, object]:
    description, make, batch, loss_fn = _gpt_loops() if model_name == "gpt" else _mlp_loops()
    timer = time.thread_time if clock == "cpu" else time.perf_counter
    # loss_spike observes SDPA through a process-wide patch of the function: the baselines call
    # the function from before any attach, or they would pay for the patch (a wrapper and a
    # listener that finds no module of its own) and understate loss_spike's cost.
    unpatched_sdpa = torch.nn.functional.scaled_dot_product_attention
    loops = {}
    sentinels = []
    for name in VARIANTS:
        model, opt = make()
        if name != "sentinel":
            for module in model.modules():
                if isinstance(module, Attention):
                    module.sdpa = unpatched_sdpa
        if name != "bare":
            disable = {"loss_spike"} if name.endswith("without_loss_spike") else set()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sentinels.append(torch_sentinel.attach(model, opt, disable=disable))
        loops[name] = (model, opt)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for step in range(warmup + steps):
        x, y = batch(step)
        order = VARIANTS[step % 3:] + VARIANTS[: step % 3]
        for name in order:
            model, opt = loops[name]
            start = timer()
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            if model_name == "gpt":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            times[name].append(timer() - start)
    for s in sentinels:
        s.detach()
    t = {name: np.array(v[warmup:]) for name, v in times.items()}

    def ratio(a: str, b: str) -> dict[str, float]:
        r = t[a] / t[b]
        q1, med, q3 = np.quantile(r, [0.25, 0.5, 0.75])
        return {"median": float(med), "q1": float(q1), "q3": float(q3), "total": float(t[a].sum() / t[b].sum())}

    extra = t["sentinel"] - t["sentinel_without_loss_spike"]
    return {
        "model": description, "steps": steps, "warmup": warmup, "threads": torch.get_num_threads(), "clock": clock,
        "median_step_ms": {name: float(np.median(v) * 1e3) for name, v in t.items()},
        "loss_spike_extra_ms": {"median": float(np.median(extra) * 1e3), "q1": float(np.quantile(extra, 0.25) * 1e3),
                                "q3": float(np.quantile(extra, 0.75) * 1e3)},
        "loss_spike_cost": ratio("sentinel", "sentinel_without_loss_spike"),
        "sentinel_vs_bare": ratio("sentinel", "bare"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt", choices=["gpt", "mlp"])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=110)
    parser.add_argument("--clock", default="wall", choices=["wall", "cpu"])
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--out", default=None, help="default: results/spikes-overhead[-mlp].json")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    result = measure(args.steps, args.warmup, args.model, args.clock)
    print(json.dumps(result, indent=1))
    name = "spikes-overhead.json" if args.model == "gpt" else f"spikes-overhead-{args.model}.json"
    out = args.out or os.path.join(os.path.dirname(__file__), "..", "results", name)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
