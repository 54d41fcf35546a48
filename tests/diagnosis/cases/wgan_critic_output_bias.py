"""Healthy: a WGAN (weight clipping) whose critic's output bias gets a gradient of exactly 0.

Written after eriklindernoren/PyTorch-GAN ``implementations/wgan/wgan.py``: an MLP generator with
BatchNorm, an MLP critic ending in ``nn.Linear(256, 1)`` (with a bias), RMSprop at lr 5e-5,
five critic steps per generator step, critic weights clamped to [-0.01, 0.01] after each of its
steps, and the critic loss ``-mean(D(real)) + mean(D(fake))``. One sentinel per network, as the
README advises for GANs. The critic loss is a difference of two means of the critic's output, so
the output bias cancels exactly: its gradient at every critic step is 0 by construction, and
that is not a wiring fault. The generator's loss ``-mean(D(G(z)))`` does reach the bias, but
the critic clears those gradients before its own backward.

Source: issue 25 ("a parameter whose gradient is exactly zero by construction (a WGAN critic's
output bias ...)"); https://github.com/eriklindernoren/PyTorch-GAN/blob/master/implementations/wgan/wgan.py .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel
from torch_sentinel import Report

SOURCE = "https://github.com/eriklindernoren/PyTorch-GAN/blob/master/implementations/wgan/wgan.py"
CLASS = "a parameter whose gradient is exactly zero by construction"
KIND, MODULE, CAUSE, ONSET = None, None, None, 0
#: an info finding the run should carry: the bias is named, with the reason
INFO = ("no_gradient", "model.4")
LATENT, DATA, N_CRITIC, CLIP = 8, 16, 5, 0.01


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Linear(LATENT, 64), nn.BatchNorm1d(64, 0.8), nn.LeakyReLU(0.2),
                                   nn.Linear(64, DATA), nn.Tanh())

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.model(z)


class Critic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Linear(DATA, 64), nn.LeakyReLU(0.2), nn.Linear(64, 32),
                                   nn.LeakyReLU(0.2), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


def run(bug: bool, watch: Callable[[Any], None]) -> Report:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    generator, critic = Generator(), Critic()
    opt_g = torch.optim.RMSprop(generator.parameters(), lr=5e-5)
    opt_d = torch.optim.RMSprop(critic.parameters(), lr=5e-5)
    basis = torch.randn(3, DATA, generator=g)
    sg = torch_sentinel.attach(generator, opt_g)
    sd = torch_sentinel.attach(critic, opt_d)
    for i in range(100):
        real = torch.tanh(torch.randn(32, 3, generator=g) @ basis)
        opt_d.zero_grad()
        fake = generator(torch.randn(32, LATENT, generator=g)).detach()
        loss_d = -torch.mean(critic(real)) + torch.mean(critic(fake))
        loss_d.backward()
        opt_d.step()
        for p in critic.parameters():
            p.data.clamp_(-CLIP, CLIP)
        if i % N_CRITIC == 0:
            opt_g.zero_grad()
            loss_g = -torch.mean(critic(generator(torch.randn(32, LATENT, generator=g))))
            loss_g.backward()
            opt_g.step()
        watch(sd)
    report = Report([*sd.report().findings, *sg.report().findings], steps=sd.step)
    sd.detach()
    sg.detach()
    return report
