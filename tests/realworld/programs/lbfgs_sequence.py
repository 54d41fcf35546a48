"""Fitting sine waves with an LSTMCell model and ``LBFGS.step(closure)``.

Modelled on: pytorch/examples ``time_sequence_prediction/train.py`` (``Sequence`` of two
``nn.LSTMCell`` and a ``nn.Linear`` unrolled over time; ``criterion = nn.MSELoss()``;
``optimizer = optim.LBFGS(seq.parameters(), lr=0.8)``; a ``closure`` doing
``optimizer.zero_grad(); out = seq(input); loss = criterion(out, target); loss.backward();
return loss`` passed to ``optimizer.step(closure)``). Smaller: one cell, 16 units, 12 time
steps, ``max_iter=4`` closure evaluations per step.

Data: sine waves with random phase; the target is the input shifted by one time step.
"""

from __future__ import annotations

from typing import Optional

import torch
from realworld.harness import Bug
from torch import nn

import torch_sentinel

MODELLED_ON = "pytorch/examples time_sequence_prediction/train.py"
HEALTHY_XFAIL: Optional[str] = None
BUGS = {
    "closure_without_zero_grad": Bug("optimizer.zero_grad() deleted from the closure",
                                     "missing_zero_grad"),
    "last_value_target_broadcast": Bug("criterion(out[:, -1:], target[:, -1]): (B, 1) vs (B,)",
                                       "loss_broadcast"),
}


class Sequence(nn.Module):
    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.hidden = hidden
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.linear = nn.Linear(hidden, 1)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(inputs.size(0), self.hidden, dtype=inputs.dtype)
        c = torch.zeros(inputs.size(0), self.hidden, dtype=inputs.dtype)
        outputs = []
        for input_t in inputs.split(1, dim=1):
            h, c = self.lstm1(input_t, (h, c))
            outputs.append(self.linear(h))
        return torch.cat(outputs, dim=1)


def waves(n: int, g: torch.Generator) -> torch.Tensor:
    phase = torch.rand(n, 1, generator=g) * 6.28
    return torch.sin(phase + torch.arange(13) * 0.5)


def run(bug: Optional[str] = None, log_dir: Optional[str] = None) -> list[float]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    data = waves(32, g)
    inputs, target = data[:, :-1], data[:, 1:]
    seq = Sequence()
    criterion = nn.MSELoss()
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8, max_iter=4)
    losses: list[float] = []
    with torch_sentinel.attach(seq, optimizer, log_dir=log_dir):
        for _i in range(8):
            def closure() -> torch.Tensor:
                if bug != "closure_without_zero_grad":
                    optimizer.zero_grad()
                out = seq(inputs)
                if bug == "last_value_target_broadcast":
                    loss = criterion(out[:, -1:], target[:, -1])
                else:
                    loss = criterion(out, target)
                loss.backward()
                losses.append(loss.item())
                return loss

            optimizer.step(closure)
    return losses
