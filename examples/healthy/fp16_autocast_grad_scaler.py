"""Healthy: fp16 autocast with a GradScaler, on a regression whose gradients sit below fp16's range.

The targets are small (a teacher scaled by 1e-3) and so is the output layer's initialisation,
so the hidden layers' gradients in fp16 would be subnormal or flush to zero (without the
scaler the sentinel reports ``precision_underflow`` on them); the GradScaler multiplies the
loss by its scale (2**16) before backward, so backward computes them in range. This is mixed
precision done right: the sentinel watches fp16 (the autocast dtype) and must find nothing.
Expected: no fault findings (``report.ok``).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = None


def run(steps: int = 40, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    teacher = torch.randn(32, 1) * 1e-3
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    with torch.no_grad():
        model[4].weight.mul_(1e-2)
        model[4].bias.zero_()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=20) as sentinel:
        for _ in range(steps):
            x = torch.randn(128, 32)
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.mse_loss(model(x).float(), x @ teacher)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return sentinel.report()


if __name__ == "__main__":
    print(run())
