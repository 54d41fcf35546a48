"""Healthy: an evaluation pass under ``no_grad`` (and one under ``inference_mode``) between
every training step, switching to eval mode and back.

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
    teacher = torch.randn(12, 3)
    model = nn.Sequential(nn.Linear(12, 48), nn.ReLU(), nn.Dropout(0.2), nn.Linear(48, 3))
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    x_eval = torch.randn(64, 12)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=20) as sentinel:
        for step in range(steps):
            x = torch.randn(32, 12)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x @ teacher).argmax(1)).backward()
            opt.step()
            model.eval()
            with torch.no_grad():
                model(x_eval * 100)  # an out-of-distribution probe: not training data
            with torch.inference_mode():
                model(x_eval)
            model.train()
            del step
        return sentinel.report()


if __name__ == "__main__":
    print(run())
