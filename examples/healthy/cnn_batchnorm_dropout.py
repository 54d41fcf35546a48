"""Healthy: a CNN with BatchNorm and dropout on normalized images (which quadrant is bright).

Expected: no fault findings (``report.ok``).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = None


def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.randint(0, 4, (n,))
    x = torch.randn(n, 3, 8, 8) * 0.5
    for i, c in enumerate(y.tolist()):
        r, q = divmod(c, 2)
        x[i, :, r * 4:(r + 1) * 4, q * 4:(q + 1) * 4] += 1.5
    return x, y


def run(steps: int = 40, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.3), nn.Linear(8 * 16, 4),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=25) as sentinel:
        for _ in range(steps):
            x, y = batch(16)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return sentinel.report()


if __name__ == "__main__":
    print(run())
