"""A RealNVP normalizing flow trained by maximum likelihood on 2-D data: the loss is a negative log-density, and goes negative.

Modelled on: karpathy/pytorch-normalizing-flows (https://github.com/karpathy/pytorch-normalizing-flows,
``nflib/flows.py`` ``AffineHalfFlow`` with ``MLP`` scale and shift nets (LeakyReLU, 24 hidden
units there), ``NormalizingFlowModel`` returning ``zs, prior_logprob, log_det``; the notebook's
training loop: ``loss = -torch.sum(prior_logprob + log_det)`` (divided by the batch size here),
Adam with weight decay 1e-5; lr 1e-4 there, 1e-3 here). The data are two interleaving half-moons (sklearn's
``make_moons`` recipe, noise 0.05) measured in a unit where they span about 0.6 x 0.3.

Why it is healthy: for a density on a small region the log-density is above zero, so
``-log p(x)`` starts at +2.6, crosses zero near step 30 and ends near -1.9; lower is better and
the flow keeps improving.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

import torch_sentinel

MODELLED_ON = "https://github.com/karpathy/pytorch-normalizing-flows/blob/master/nflib/flows.py"
BATCH, HIDDEN, FLOWS = 128, 24, 6


class MLP(nn.Module):
    def __init__(self, nin: int, nout: int, nh: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(nin, nh), nn.LeakyReLU(0.2), nn.Linear(nh, nh), nn.LeakyReLU(0.2),
                                 nn.Linear(nh, nh), nn.LeakyReLU(0.2), nn.Linear(nh, nout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class AffineHalfFlow(nn.Module):
    def __init__(self, dim: int, parity: bool, nh: int = HIDDEN) -> None:
        super().__init__()
        self.parity = parity
        self.s_cond = MLP(dim // 2, dim // 2, nh)
        self.t_cond = MLP(dim // 2, dim // 2, nh)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x0, x1 = x[:, ::2], x[:, 1::2]
        if self.parity:
            x0, x1 = x1, x0
        s, t = self.s_cond(x0), self.t_cond(x0)
        z0, z1 = x0, torch.exp(s) * x1 + t
        if self.parity:
            z0, z1 = z1, z0
        return torch.cat([z0, z1], dim=1), torch.sum(s, dim=1)


class NormalizingFlowModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.flows = nn.ModuleList([AffineHalfFlow(2, parity=i % 2 == 1) for i in range(FLOWS)])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        log_det = torch.zeros(x.shape[0])
        for flow in self.flows:
            x, ld = flow(x)
            log_det = log_det + ld
        prior_logprob = -0.5 * (x**2).sum(1) - math.log(2 * math.pi)
        return x, prior_logprob, log_det


def moons(n: int, g: torch.Generator) -> torch.Tensor:
    t = torch.rand(n, generator=g) * math.pi
    upper = torch.rand(n, generator=g) < 0.5
    x = torch.where(upper, torch.cos(t), 1 - torch.cos(t))
    y = torch.where(upper, torch.sin(t), 0.5 - torch.sin(t))
    pts = torch.stack([x, y], 1) + 0.05 * torch.randn(n, 2, generator=g)
    return (pts - torch.tensor([0.5, 0.25])) * 0.2


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = NormalizingFlowModel()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-5)
    sentinel = torch_sentinel.attach(model, optimizer, log_dir=log_dir)
    model.train()
    for _ in range(steps):
        x = moons(BATCH, g)
        _zs, prior_logprob, log_det = model(x)
        logprob = prior_logprob + log_det
        loss = -torch.sum(logprob) / BATCH
        model.zero_grad()
        loss.backward()
        optimizer.step()
        if progress is not None:
            progress.append(loss.item())
    report = sentinel.report()
    sentinel.detach()
    return report
