"""Fault: a deep MLP with sigmoid activations; each layer multiplies the gradient by at most
0.25, so the first layers learn nothing.

Source pattern: the vanishing-gradient textbook case, AUTOTRAINER "vanishing gradient" (ratio
< 1e-3 and first-layer norm < 1e-4); StackOverflow "deep network with sigmoid does not learn".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "vanishing_gradient", "boundary": "gradients", "module": "0"}


def run(steps: int = 12, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(10):
        layers += [nn.Linear(16, 16), nn.Sigmoid()]
    model = nn.Sequential(*layers, nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for _ in range(steps):
            x = torch.randn(32, 16)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
            opt.step()
        return sentinel.report()
