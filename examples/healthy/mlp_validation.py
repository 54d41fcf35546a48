"""Healthy: an MLP classifier with a validation pass every 10 steps (eval mode, no_grad).

Expected: no fault findings (``report.ok``).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = None


def run(steps: int = 60, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    teacher = torch.randn(16, 4)
    x_val = torch.randn(128, 16)
    y_val = (x_val @ teacher).argmax(1)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=20) as sentinel:
        for step in range(steps):
            x = torch.randn(64, 16)
            loss = nn.functional.cross_entropy(model(x), (x @ teacher).argmax(1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 10 == 9:
                model.eval()
                with torch.no_grad():
                    sentinel.observe_validation(nn.functional.cross_entropy(model(x_val), y_val))
                model.train()
        return sentinel.report()


if __name__ == "__main__":
    print(run())
