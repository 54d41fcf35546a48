"""Fault: images fed as raw 0..255 pixel values (``ToTensor`` skipped, ``Normalize`` missing).

Source pattern: StackOverflow "CNN not learning: forgot to divide by 255"; UMLAUT "inputs
outside [-1, 1]".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "unnormalized_input", "boundary": "data", "module": None}


def run(steps: int = 15, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=1e-5)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for _ in range(steps):
            x = torch.randint(0, 256, (16, 1, 8, 8)).float()  # the bug: 0..255
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), torch.randint(0, 3, (16,))).backward()
            opt.step()
        return sentinel.report()
