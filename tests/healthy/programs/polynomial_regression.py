"""Fitting a degree-4 polynomial with one linear layer and a hand-written SGD update, no optimizer.

Modelled on: pytorch/examples ``regression/main.py``
(https://github.com/pytorch/examples/blob/main/regression/main.py): features ``x, x^2, x^3,
x^4``, a random target polynomial (``W_target = randn(4, 1) * 5``, ``b_target = randn(1) * 5``),
``fc = torch.nn.Linear(4, 1)``, ``F.smooth_l1_loss``, ``fc.zero_grad()`` and
``param.data.add_(-0.1 * param.grad)`` for every parameter, batches of 32. The example stops once
the loss is below 1e-3; here the loop runs its fixed number of steps, as a script with an epoch
count would. ``attach(fc)`` without an optimizer: each ``backward()`` is a step.

Why it is healthy: the data are noise-free and the model is exactly the right one, so the loss
keeps falling (its 30-step mean about 20-fold over the run). ``x^4`` of a normal sample is
heavy-tailed: a batch that holds a large ``x`` has a loss several times its neighbours', and the
smooth L1 loss keeps each such step bounded.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

import torch_sentinel

MODELLED_ON = "https://github.com/pytorch/examples/blob/main/regression/main.py"
POLY_DEGREE = 4


def make_features(x: torch.Tensor) -> torch.Tensor:
    x = x.unsqueeze(1)
    return torch.cat([x**i for i in range(1, POLY_DEGREE + 1)], 1)


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    w_target = torch.randn(POLY_DEGREE, 1) * 5
    b_target = torch.randn(1) * 5

    def get_batch(batch_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
        x = make_features(torch.randn(batch_size))
        return x, x.mm(w_target) + b_target.item()

    fc = torch.nn.Linear(w_target.size(0), 1)
    sentinel = torch_sentinel.attach(fc, log_dir=log_dir)
    for _ in range(steps):
        batch_x, batch_y = get_batch()
        fc.zero_grad()
        output = F.smooth_l1_loss(fc(batch_x), batch_y)
        loss = output.item()
        output.backward()
        for param in fc.parameters():
            param.data.add_(-0.1 * param.grad)
        if progress is not None:
            progress.append(loss)
    report = sentinel.report()
    sentinel.detach()
    return report
