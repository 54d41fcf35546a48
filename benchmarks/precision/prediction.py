"""Prediction: runs whose activations grow x1.1 a step, reported before they overflow fp16?

Each run trains an MLP (64-256-256-10, ReLU, AdamW at lr 1e-4, a fresh random batch of 64
every step) whose input is scaled by ``s0 * 1.1**step``, so its first layer's largest output
grows x1.1 a step, with the batch-to-batch scatter of a real activation maximum. ``s0`` is set
so that the largest output passes fp16's overflow edge (65520) near a target step, 45 to 135
across the ten runs (past step 100 the sentinel samples every 50 steps). The harness checks
the output on every step for the step it really passes the edge; the sentinel watches fp16
(``precision=("fp16",)``: a float32 run, so the finding is ``info``).

A run is a hit when ``precision_overflow`` was concluded at least 10 steps before the real
overflow and its predicted step is within +-2 of it. ``reported`` is the step at which the
finding reached ``sentinel.findings`` (detectors run every ``flush_every=10`` steps).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

import torch_sentinel
from torch_sentinel.precision.formats import FORMATS

__all__ = ["run", "run_one"]

GROWTH = 1.1
EDGE = FORMATS["fp16"].edges["overflow"].value


def run_one(seed: int, target: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        probe = model[0](torch.randn(64, 64, generator=g)).abs().max().item()
    start = EDGE / (probe * GROWTH**target)
    actual = [-1]
    step_now = [0]

    def check(module: nn.Module, args: Any, out: torch.Tensor) -> None:
        if actual[0] < 0 and out.detach().abs().max().item() > EDGE:
            actual[0] = step_now[0]

    model[0].register_forward_hook(check)
    found: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch_sentinel.attach(model, opt, precision=("fp16",),
                                   disable={"unnormalized_input", "exploding_gradient", "diverging",
                                            "update_ratio", "plateau"}) as s:
            for step in range(target + 15):
                step_now[0] = step
                x = torch.randn(64, 64, generator=g) * (start * GROWTH**step)
                y = torch.randint(0, 10, (64,), generator=g)
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                if not found:
                    hits = [f for f in s.findings if f.kind == "precision_overflow" and f.module == "0"
                            and f.evidence["tensor"] == "activation"]
                    if hits:
                        found = {"concluded": hits[0].step, "reported": step,
                                 "predicted": hits[0].evidence["predicted_overflow_step"],
                                 "error_sd": hits[0].evidence.get("prediction_error")}
    out: dict[str, Any] = {"seed": seed, "target": target, "actual": actual[0], **found}
    if found and actual[0] >= 0:
        out["lead"] = actual[0] - found["concluded"]
        out["lead_reported"] = actual[0] - found["reported"]
        out["error"] = found["predicted"] - actual[0]
        out["hit"] = out["lead"] >= 10 and abs(out["error"]) <= 2
    else:
        out["hit"] = False
    return out


def run(runs: int = 10) -> dict[str, Any]:
    rows = [run_one(seed, 45 + 10 * (seed % 10)) for seed in range(runs)]
    return {"runs": rows, "hits": sum(r["hit"] for r in rows), "of": len(rows)}
