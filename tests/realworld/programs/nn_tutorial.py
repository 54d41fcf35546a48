"""Logistic regression with a hand-written update and no optimizer object.

Modelled on: pytorch/tutorials ``beginner_source/nn_tutorial.py`` ("What is torch.nn
really?"), the "Refactor using nn.Module" stage: ``class Mnist_Logistic(nn.Module)`` with
``self.weights = nn.Parameter(torch.randn(784, 10) / math.sqrt(784))`` and a bias;
``loss_func = F.cross_entropy``; the ``fit()`` loop doing ``loss.backward()`` then
``with torch.no_grad(): for p in model.parameters(): p -= p.grad * lr`` and
``model.zero_grad()``. The sentinel is attached without an optimizer.

Data: 64-pixel "images" from ten noisy prototypes.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from realworld.harness import Bug
from torch import nn

import torch_sentinel

MODELLED_ON = "pytorch/tutorials beginner_source/nn_tutorial.py (Refactor using nn.Module)"
HEALTHY_XFAIL: Optional[str] = None
BUGS = {
    # attach(model) without an optimizer: each backward() is a step (issue 11).
    "no_zero_grad": Bug("model.zero_grad() deleted after the update", "missing_zero_grad"),
    "lr_x100": Bug("lr = 20 instead of 0.2 (100x)", "diverging"),
}


class MnistLogistic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weights = nn.Parameter(torch.randn(64, 10) / math.sqrt(64))
        self.bias = nn.Parameter(torch.zeros(10))

    def forward(self, xb: torch.Tensor) -> torch.Tensor:
        return xb @ self.weights + self.bias


def run(bug: Optional[str] = None, log_dir: Optional[str] = None) -> list[float]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    protos = torch.randn(10, 64, generator=g)
    y_train = torch.randint(0, 10, (960,), generator=g)
    x_train = protos[y_train] + 3 * torch.randn(960, 64, generator=g)
    model = MnistLogistic()
    loss_func = F.cross_entropy
    lr, bs = 0.2 * (100 if bug == "lr_x100" else 1), 32
    losses: list[float] = []
    with torch_sentinel.attach(model, log_dir=log_dir):
        for i in range(len(x_train) // bs):
            xb, yb = x_train[i * bs:(i + 1) * bs], y_train[i * bs:(i + 1) * bs]
            loss = loss_func(model(xb), yb)
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= p.grad * lr
                if bug != "no_zero_grad":
                    model.zero_grad()
            losses.append(loss.item())
    return losses
