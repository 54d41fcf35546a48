"""Fault: the model ends in ``nn.Softmax`` and its output goes to ``CrossEntropyLoss``, which
applies log-softmax again.

Source pattern: StackOverflow "Should I use softmax as output when using cross entropy loss in
PyTorch?" (the most common PyTorch classification bug); UMLAUT "softmax before the loss".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "probabilities_as_logits", "boundary": "loss", "module": "3"}


def run(steps: int = 25, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 5), nn.Softmax(dim=1))
    criterion = nn.CrossEntropyLoss()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for _ in range(steps):
            x = torch.randn(32, 12)
            opt.zero_grad()
            criterion(model(x), x[:, :5].argmax(1)).backward()
            opt.step()
        return sentinel.report()
