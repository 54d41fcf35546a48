"""Fault: softmax probabilities (not log-probabilities) are fed to ``nll_loss``.

Source pattern: DeepDiagnosis / StackOverflow "NLLLoss is negative" — ``F.nll_loss`` expects
``log_softmax`` output; with probabilities the loss is negative and barely trains.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

import torch_sentinel

EXPECTED = {"kind": "probabilities_as_logits", "boundary": "loss", "module": ""}  # F.softmax in Net.forward


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softmax(self.fc2(F.relu(self.fc1(x))), dim=1)  # the bug: softmax, not log_softmax


def run(steps: int = 25, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for _ in range(steps):
            x = torch.randn(32, 12)
            opt.zero_grad()
            F.nll_loss(model(x), x[:, :4].argmax(1)).backward()
            opt.step()
        return sentinel.report()
