"""Fault: a wide MLP trained for many epochs on 48 examples with 30% wrong labels memorises
them; the validation loss turns around and climbs while the training loss keeps falling.

Source pattern: the seeds' Case C ("training loss falls while validation loss rises");
StackOverflow "validation loss increasing after first epochs".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "overfitting", "boundary": "curves", "module": None}


def run(steps: int = 120, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    teacher = torch.randn(20, 3)
    x_train = torch.randn(48, 20)
    y_train = (x_train @ teacher).argmax(1)
    noisy = torch.rand(48) < 0.3
    y_train[noisy] = torch.randint(0, 3, (int(noisy.sum()),))  # few examples, noisy labels
    x_val = torch.randn(300, 20)
    y_val = (x_val @ teacher).argmax(1)
    model = nn.Sequential(nn.Linear(20, 256), nn.ReLU(), nn.Linear(256, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=25) as sentinel:
        for step in range(steps):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x_train), y_train).backward()
            opt.step()
            if step % 10 == 9:
                with torch.no_grad():
                    sentinel.observe_validation(nn.functional.cross_entropy(model(x_val), y_val))
        return sentinel.report()
