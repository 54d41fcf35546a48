"""Healthy: fine-tuning a new head on a frozen backbone (requires_grad=False, BatchNorm in eval).

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
    backbone = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
    model = nn.Sequential(backbone, nn.Linear(32, 3))
    for p in backbone.parameters():
        p.requires_grad_(False)
    backbone.eval()  # frozen batch-norm statistics, the usual fine-tuning recipe
    teacher = torch.randn(16, 3)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=20) as sentinel:
        for _ in range(steps):
            x = torch.randn(32, 16)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x @ teacher).argmax(1)).backward()
            opt.step()
        return sentinel.report()


if __name__ == "__main__":
    print(run())
