"""Which runs make the benchmark: the tuning split and the held-out split, fixed in advance.

The forensics' constants were tuned on the ``tune`` split only; the ``heldout`` split (other
seeds, and a base model pretrained from another seed) was run once, at the end, for the
published figures. The ``fresh`` split (other seeds again, its own base model) was written on
2026-12-03, before trying the logit figures on alternate steps, and first run with that change
(``results/spikes-fresh-first-run.md``: the figure for code the change was not shaped on; the
change was not kept). Each split resumes its own base checkpoint (3,000 steps of pretraining,
loss about 1.3 nats per byte), so every module carries learned function when a cause hits it.
"""

from __future__ import annotations

import os

from .injections import CAUSES, draw
from .train import Run, pretrain

__all__ = ["CACHE", "SPLITS", "checkpoint", "runs_for"]

CACHE = os.path.join(os.path.dirname(__file__), "cache")
PRETRAIN_STEPS = 3000
#: split -> (pretraining seed, injection seeds per cause, clean runs as (seed, steps, beta2)).
SPLITS = {
    "tune": (100, range(0, 4), [(0, 1000, 0.95), (1, 1000, 0.95), (2, 1000, 0.999)]),
    "heldout": (200, range(100, 110), [(100 + i, 1250, 0.95 if i < 2 else 0.999) for i in range(4)]),
    "fresh": (300, range(200, 206), [(200, 1250, 0.95), (201, 1250, 0.999)]),
}
#: The learning rate of a run at each beta2 (the adam_second_moment runs' setting).
LR = {0.95: 1e-3, 0.999: 2e-3
}
#: Steps an injected run goes on after its injection.
AFTER = 40


def checkpoint(split: str) -> str:
    """The split's base checkpoint, pretrained on first use."""
    seed = SPLITS[split][0]
    path = os.path.join(CACHE, f"base-{split}.pt")
    if not os.path.exists(path):
        os.makedirs(CACHE, exist_ok=True)
        pretrain(seed, PRETRAIN_STEPS, path)
    return path


def runs_for(split: str) -> list[Run]:
    _, seeds, clean = SPLITS[split]
    base = checkpoint(split)
    runs = [Run(seed, steps, base, None, beta2, LR[beta2]) for seed, steps, beta2 in clean]
    for cause in CAUSES:
        for seed in seeds:
            inj = draw(cause, seed)
            runs.append(Run(seed, inj.t0 + AFTER, base, inj, inj.beta2, inj.lr))
    return runs
