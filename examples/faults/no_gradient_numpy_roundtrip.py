"""Fault: a feature computed with numpy in the middle of ``forward`` cuts the graph; the
layers before it never receive gradients.

Source pattern: StackOverflow "gradients are None after converting to numpy and back"
(``torch.from_numpy(x.detach().numpy())`` to call a numpy/scipy helper).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "no_gradient", "boundary": "gradients", "module": "stem"}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(10, 20)
        self.head = nn.Linear(20, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = torch.from_numpy(np.tanh(h.detach().numpy()))  # the bug: a numpy round trip
        return self.head(h)


def run(steps: int = 20, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for _ in range(steps):
            x = torch.randn(32, 10)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
            opt.step()
        return sentinel.report()
