"""Fault: a learning rate of 1e-6 with SGD: the loss sits at chance level, ln(C), for the whole
run.

Source pattern: StackOverflow "loss stuck at 2.30 on MNIST" (ln 10: chance level);
DeepDiagnosis "loss unchanged"; UMLAUT "learning rate outside [1e-7, 0.01]".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "plateau", "boundary": "curves", "module": None}


def run(steps: int = 40, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    teacher = torch.randn(20, 10)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)  # the bug
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=20) as sentinel:
        for _ in range(steps):
            x = torch.randn(64, 20)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x @ teacher).argmax(1)).backward()
            opt.step()
        return sentinel.report()
