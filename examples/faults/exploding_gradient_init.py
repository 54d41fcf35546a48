"""Fault: a deep ReLU MLP initialised with N(0, 1) weights (ignoring fan-in), so gradients grow
by ~sqrt(fan_in / 2) per layer on their way back to the input.

Source pattern: AUTOTRAINER "exploding gradient" (first/last gradient ratio > 70); StackOverflow
"custom weight init with torch.randn makes the loss explode".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "exploding_gradient", "boundary": "gradients", "module": "0"}


def run(steps: int = 12, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(6):
        layers += [nn.Linear(32, 32), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(32, 1))
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 1.0)  # the bug: std 1 instead of sqrt(2 / fan_in)
    opt = torch.optim.SGD(model.parameters(), lr=1e-12)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for _ in range(steps):
            x = torch.randn(16, 32)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), torch.zeros(16, 1)).backward()
            opt.step()
        return sentinel.report()
