"""A progressive GAN's discriminator has a minibatch-standard-deviation layer (``torch.std(x,
dim=0)`` over the batch). The dataset has 65 images and the loader uses batch size 8 without
``drop_last``, so every epoch ends with a batch of one sample: the standard deviation of a single
value is NaN (unbiased estimate, n - 1 = 0), the discriminator's output and the loss are NaN from
that step on. The fix: ``drop_last=True`` (or skip batches of one).

Source: ziwei-jiang/PGGAN-PyTorch#1 "loss is NAN" ("I could trace it to the class Minibatch_std
... At the 9th iteration only one sample is left in the dataset ... std = torch.std(x, dim=0).
This results in nan values since you try to calculate the standard deviation of a single
number"), https://github.com/ziwei-jiang/PGGAN-PyTorch/issues/1 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/ziwei-jiang/PGGAN-PyTorch/issues/1"
CLASS = "batch statistic over a batch of one (NaN)"
KIND, MODULE, CAUSE, ONSET = "non_finite", "D.mbstd", "local_forward", 8


class MinibatchStd(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        std = torch.std(x, dim=0).mean()  # one number over the batch
        return torch.cat([x, std.expand(x.size(0), 1)], dim=1)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2))
        self.mbstd = MinibatchStd()
        self.out = nn.Linear(33, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.mbstd(self.features(x)))


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
    D = Discriminator()
    optD = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.0, 0.99))
    optG = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.0, 0.99))
    data = torch.utils.data.TensorDataset(torch.randn(65, 16, generator=torch.Generator().manual_seed(1)).tanh())  # 65 "images"
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, drop_last=not bug,  # the bug: drop_last=False
                                         generator=torch.Generator().manual_seed(2))
    g = torch.Generator().manual_seed(3)
    softplus = nn.functional.softplus
    with torch_sentinel.attach(nn.ModuleDict({"G": G, "D": D}), [optD, optG]) as s:
        for _epoch in range(4):
            for (real,) in loader:
                fake = G(torch.randn(real.size(0), 8, generator=g))
                optD.zero_grad()
                (softplus(-D(real)).mean() + softplus(D(fake.detach())).mean()).backward()
                optD.step()
                optG.zero_grad()
                softplus(-D(fake)).mean().backward()
                optG.step()
                watch(s)
        return s.report()
