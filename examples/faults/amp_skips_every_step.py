"""Fault: under AMP, pairwise distances computed as ``sqrt(sum(diff ** 2))`` have a NaN gradient
on the diagonal (the distance of a sample to itself is 0); the GradScaler skips every step,
halving its scale, and the model never trains, silently.

Source pattern: pytorch #152279 ("users can't see the steps the scaler skipped"); GitHub/forum
threads "NaN gradient from pairwise distance of identical points" and "GradScaler scale keeps
decreasing, loss never changes".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "amp_skips", "boundary": "gradients", "module": None}


class Embedder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.fc(x)
        # the bug: sqrt at 0 on the diagonal, whose gradient is 0 * inf = NaN
        return ((z[:, None] - z[None]) ** 2).sum(-1).sqrt()


def run(steps: int = 40, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = Embedder()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for _ in range(steps):
            x = torch.randn(16, 8)
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.mse_loss(model(x).float(), torch.cdist(x, x))
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return sentinel.report()
