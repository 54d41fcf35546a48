"""Healthy: mixed precision with a GradScaler whose first steps are skipped.

The scaler starts with a scale so large that the scaled gradients overflow; it skips those
steps and halves the scale until they fit. A few skipped steps are the scaler working.
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
    teacher = torch.randn(16, 4)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**126)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=20) as sentinel:
        for _ in range(steps):
            x = torch.randn(32, 16)
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(x).float(), (x @ teacher).argmax(1))
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return sentinel.report()


if __name__ == "__main__":
    print(run())
