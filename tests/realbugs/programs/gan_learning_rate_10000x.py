"""A GAN trained with Adam at a learning rate of 2.0 where the DCGAN recipe uses 0.0002 (10,000x,
a typo in the config): every update rewrites the weights, the discriminator and generator losses
jump between saturated values and the generator never fits the data. Lowering the learning rate
is the fix.

Source: dyelax/Adversarial_Video_Generation#5 "Getting nans during training" (maintainer: "I
usually find NaN is a result of the learning rate being too high"),
https://github.com/dyelax/Adversarial_Video_Generation/issues/5 ; manicman1999/StyleGAN2-Tensorflow-2.0#4
"I keep hitting NaN value error" ("The learning rate may be too large ... I haven't had any
problems since then"), https://github.com/manicman1999/StyleGAN2-Tensorflow-2.0/issues/4 ; the
DCGAN recipe's learning rate 0.0002 (Radford et al. 2016, section 4).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = ("https://github.com/dyelax/Adversarial_Video_Generation/issues/5; "
          "https://github.com/manicman1999/StyleGAN2-Tensorflow-2.0/issues/4")
CLASS = "learning rate far too high"
KIND, MODULE, CAUSE, ONSET = "update_ratio", None, "learning_rate", 0
#: the finding must say the learning rate is too high (``update_ratio`` also reports "too low")
NEXT_CHECK = "lower_learning_rate"


def real_batch(n: int, g: torch.Generator) -> torch.Tensor:
    angle = torch.randint(0, 8, (n,), generator=g).float() * (torch.pi / 4)
    ring = torch.stack([angle.cos(), angle.sin()], 1) * 2
    return ring + 0.05 * torch.randn(n, 2, generator=g)


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))
    D = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    lr = 2.0 if bug else 2e-4  # the bug: 10,000x the recipe's 0.0002
    optD = torch.optim.Adam(D.parameters(), lr=lr, betas=(0.5, 0.999))
    optG = torch.optim.Adam(G.parameters(), lr=lr, betas=(0.5, 0.999))
    bce = nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(nn.ModuleDict({"G": G, "D": D}), [optD, optG]) as s:
        for _ in range(60):
            real = real_batch(64, g)
            fake = G(torch.randn(64, 8, generator=g))
            D.zero_grad()
            errD = bce(D(real), torch.ones(64, 1)) + bce(D(fake.detach()), torch.zeros(64, 1))
            errD.backward()
            optD.step()
            G.zero_grad()
            errG = bce(D(fake), torch.ones(64, 1))
            errG.backward()
            optG.step()
            watch(s)
        return s.report()
