"""Fault: the classifier head is replaced *after* the optimizer was built, so the optimizer
still holds the old head and the new one is never updated.

Source pattern: PyTorch forums / StackOverflow transfer learning "replaced model.fc but
accuracy stays at chance" (optimizer created before ``model.fc = nn.Linear(...)``).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "unregistered_parameter", "boundary": "updates", "module": "fc"}


class Net(nn.Module):
    def __init__(self, classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, 32), nn.ReLU())
        self.fc = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x))


def run(steps: int = 20, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = Net(10)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model.fc = nn.Linear(32, 3)  # the bug: new head after the optimizer
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for _ in range(steps):
            x = torch.randn(32, 12)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
            opt.step()
        return sentinel.report()
