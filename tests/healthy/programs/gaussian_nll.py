"""Heteroscedastic regression: the network predicts a mean and a variance, trained with Gaussian NLL.

Modelled on: the 1-D regression setup of "Simple and Scalable Predictive Uncertainty Estimation
using Deep Ensembles" (Lakshminarayanan et al. 2017) as written with
``torch.nn.GaussianNLLLoss`` (https://pytorch.org/docs/stable/generated/torch.nn.GaussianNLLLoss.html):
one network with two outputs, the variance made positive with a softplus plus a small floor,
``GaussianNLLLoss(full=True)``, Adam at lr 1e-3. Data: y = sin(3x) + noise whose standard
deviation grows from 0.02 to 0.2 across x in [-1, 1].

Why it is healthy: the negative log-likelihood of a continuous density is negative wherever the
predicted density exceeds 1, which it does once the variance fits the small noise: the loss
starts near +0.7, crosses zero around step 130 and ends near -0.7 (the optimum for this noise
is about -1.6). Lower is still better.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

import torch_sentinel

MODELLED_ON = "https://pytorch.org/docs/stable/generated/torch.nn.GaussianNLLLoss.html"
BATCH = 64


class MeanVarianceNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.out = nn.Linear(64, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, raw_var = self.out(self.body(x)).unbind(-1)
        return mean, F.softplus(raw_var) + 1e-6


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = MeanVarianceNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.GaussianNLLLoss(full=True)
    with torch_sentinel.attach(model, optimizer, log_dir=log_dir) as sentinel:
        for _ in range(steps):
            x = torch.rand(BATCH, 1, generator=g) * 2 - 1
            noise_std = 0.02 + 0.09 * (x[:, 0] + 1)
            y = torch.sin(3 * x[:, 0]) + noise_std * torch.randn(BATCH, generator=g)
            mean, var = model(x)
            loss = loss_fn(mean, y, var)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if progress is not None:
                progress.append(loss.item())
        return sentinel.report()
