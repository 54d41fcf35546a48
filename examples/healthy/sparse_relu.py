"""Healthy: sparse but alive ReLUs. Inputs are sparse one-hot-like bags of features, so each
hidden unit fires on only a few percent of the samples, but every unit fires in some batch.

Expected: no fault findings (``report.ok``).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

import torch_sentinel

EXPECTED = None


class SparseNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 64)
        with torch.no_grad():
            # each unit listens to one input feature, and fires only when that feature is on
            self.fc1.weight.copy_(torch.eye(64) * 2.0)
            self.fc1.bias.fill_(-1.0)
        self.head = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.fc1(x)))


def run(steps: int = 40, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = SparseNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=20) as sentinel:
        for _ in range(steps):
            x = (torch.rand(32, 64) < 0.03).float()  # ~2 active features per sample
            y = x[:, :16].sum(1).clamp(max=3).long()
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        return sentinel.report()


if __name__ == "__main__":
    print(run())
