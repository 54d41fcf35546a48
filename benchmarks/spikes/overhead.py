"""What the ``loss_spike`` probe costs on the benchmark transformer, interleaved in one process.

    python -m benchmarks.spikes.overhead [--steps 300] [--warmup 110]

Three copies of the benchmark GPT (same weights, same batches) train in turn, one step each per
round: bare, with the sentinel (default detectors, ``loss_spike`` included), and with the
sentinel without ``loss_spike`` (``disable={"loss_spike"}``). Past ``--warmup`` steps (the
sentinel's sampling is sparse from step 100), each round's step times are paired; reported:
the median of the per-round ratios with their interquartile range, and the ratio of total
times. On a shared machine the figures wander: rerun on a quiet one before quoting them.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import numpy as np
import torch

import torch_sentinel

from .model import GPT, Config, Corpus, lm_loss, param_groups

VARIANTS = ("bare", "sentinel", "sentinel_without_loss_spike")


def measure(steps: int, warmup: int) -> dict[str, object]:
    cfg = Config()
    torch.manual_seed(0)
    template = GPT(cfg)
    corpus, g = Corpus(), torch.Generator().manual_seed(0)
    batches = [corpus.batch(g, cfg.batch, cfg.seq) for _ in range(16)]
    loops = {}
    sentinels = []
    for name in VARIANTS:
        model = GPT(cfg)
        model.load_state_dict(template.state_dict())
        opt = torch.optim.AdamW(param_groups(model), lr=cfg.lr, betas=(0.9, cfg.beta2), weight_decay=cfg.weight_decay)
        if name != "bare":
            disable = {"loss_spike"} if name.endswith("without_loss_spike") else set()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sentinels.append(torch_sentinel.attach(model, opt, disable=disable))
        loops[name] = (model, opt)
    times = {name: [] for name in VARIANTS}
    for step in range(warmup + steps):
        x, y = batches[step % len(batches)]
        for name in VARIANTS:
            model, opt = loops[name]
            start = time.perf_counter()
            opt.zero_grad()
            loss = lm_loss(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            times[name].append(time.perf_counter() - start)
    for s in sentinels:
        s.detach()
    t = {name: np.array(v[warmup:]) for name, v in times.items()}

    def ratio(a: str, b: str) -> dict[str, float]:
        r = t[a] / t[b]
        q1, med, q3 = np.quantile(r, [0.25, 0.5, 0.75])
        return {"median": float(med), "q1": float(q1), "q3": float(q3), "total": float(t[a].sum() / t[b].sum())}

    return {
        "steps": steps, "warmup": warmup, "threads": torch.get_num_threads(),
        "median_step_ms": {name: float(np.median(v) * 1e3) for name, v in t.items()},
        "loss_spike_cost": ratio("sentinel", "sentinel_without_loss_spike"),
        "sentinel_vs_bare": ratio("sentinel", "bare"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=110)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "results", "spikes-overhead.json"))
    args = parser.parse_args()
    result = measure(args.steps, args.warmup)
    print(json.dumps(result, indent=1))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
