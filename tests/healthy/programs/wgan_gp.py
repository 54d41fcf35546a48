"""WGAN-GP on the 8-Gaussians toy: five critic steps per generator step, a gradient penalty, and
three separate ``backward()`` calls per critic step.

Modelled on: caogang/wgan-gp ``gan_toy.py`` (https://github.com/caogang/wgan-gp/blob/master/gan_toy.py):
ReLU MLP generator and critic (512 wide there, 64 here), ``8gaussians`` data, ``CRITIC_ITERS =
5``, ``LAMBDA = 0.1``, Adam with betas (0.5, 0.9) for both nets (lr 1e-4 there over 100k
iterations, 5e-4 here over 60), weights drawn from
N(0, 0.02) with zero biases; per critic step ``D_real.backward(mone)``, ``D_fake.backward(one)``
on a detached fake batch and ``gradient_penalty.backward()`` (``autograd.grad`` of the critic at
interpolates with ``create_graph=True``); the critic's parameters get ``requires_grad = False``
while the generator steps. One sentinel watches both nets in an ``nn.ModuleDict``, as the
README advises for GANs. ``steps`` counts critic steps (the sentinel's steps: 300 of them are
60 generator iterations).

Why it is healthy: the Wasserstein critic's loss ``D(fake) - D(real)`` is a difference of the
critic's mean outputs, so the bias of its output layer cancels exactly: its gradient is 0 at
every critic step, by construction, and it keeps its initial value 0. The losses are adversarial
and do not fall steadily; the generated points move towards the eight modes (their mean distance
to the nearest mode falls by about a third in 60 generator iterations).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import autograd, nn

import torch_sentinel

MODELLED_ON = "https://github.com/caogang/wgan-gp/blob/master/gan_toy.py"
DIM, BATCH_SIZE, CRITIC_ITERS, LAMBDA, LR = 64, 64, 5, 0.1, 5e-4
SCALE = 2.0
CENTERS = torch.tensor([(1, 0), (-1, 0), (0, 1), (0, -1), (1 / math.sqrt(2), 1 / math.sqrt(2)),
                        (1 / math.sqrt(2), -1 / math.sqrt(2)), (-1 / math.sqrt(2), 1 / math.sqrt(2)),
                        (-1 / math.sqrt(2), -1 / math.sqrt(2))]) * SCALE / 1.414


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(nn.Linear(2, DIM), nn.ReLU(True), nn.Linear(DIM, DIM), nn.ReLU(True),
                                  nn.Linear(DIM, DIM), nn.ReLU(True), nn.Linear(DIM, 2))

    def forward(self, noise: torch.Tensor) -> torch.Tensor:
        return self.main(noise)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(nn.Linear(2, DIM), nn.ReLU(True), nn.Linear(DIM, DIM), nn.ReLU(True),
                                  nn.Linear(DIM, DIM), nn.ReLU(True), nn.Linear(DIM, 1))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.main(inputs).view(-1)


def weights_init(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        m.weight.data.normal_(0.0, 0.02)
        m.bias.data.fill_(0)


def calc_gradient_penalty(net_d: nn.Module, real_data: torch.Tensor, fake_data: torch.Tensor) -> torch.Tensor:
    alpha = torch.rand(BATCH_SIZE, 1).expand(real_data.size())
    interpolates = (alpha * real_data + (1 - alpha) * fake_data).requires_grad_(True)
    disc_interpolates = net_d(interpolates)
    gradients = autograd.grad(outputs=disc_interpolates, inputs=interpolates,
                              grad_outputs=torch.ones(disc_interpolates.size()),
                              create_graph=True, retain_graph=True, only_inputs=True)[0]
    return ((gradients.norm(2, dim=1) - 1) ** 2).mean() * LAMBDA


def inf_train_gen() -> torch.Tensor:
    return torch.randn(BATCH_SIZE, 2) * 0.02 + CENTERS[torch.randint(0, 8, (BATCH_SIZE,))]


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(1)
    net_g, net_d = Generator(), Discriminator()
    net_g.apply(weights_init)
    net_d.apply(weights_init)
    optimizer_d = torch.optim.Adam(net_d.parameters(), lr=LR, betas=(0.5, 0.9))
    optimizer_g = torch.optim.Adam(net_g.parameters(), lr=LR, betas=(0.5, 0.9))
    one, mone = torch.tensor(1.0), torch.tensor(-1.0)
    sentinel = torch_sentinel.attach(nn.ModuleDict({"G": net_g, "D": net_d}), [optimizer_d, optimizer_g],
                                     log_dir=log_dir)
    for _ in range(steps // CRITIC_ITERS):
        for p in net_d.parameters():
            p.requires_grad = True
        for _iter_d in range(CRITIC_ITERS):
            real_data = inf_train_gen()
            net_d.zero_grad()
            d_real = net_d(real_data).mean()
            d_real.backward(mone)
            with torch.no_grad():
                fake = net_g(torch.randn(BATCH_SIZE, 2))
            d_fake = net_d(fake).mean()
            d_fake.backward(one)
            gradient_penalty = calc_gradient_penalty(net_d, real_data, fake)
            gradient_penalty.backward()
            optimizer_d.step()
        for p in net_d.parameters():
            p.requires_grad = False
        net_g.zero_grad()
        fake = net_g(torch.randn(BATCH_SIZE, 2))
        g = net_d(fake).mean()
        g.backward(mone)
        optimizer_g.step()
        if progress is not None:
            progress.append(torch.cdist(fake.detach(), CENTERS).min(1).values.mean().item())
    report = sentinel.report()
    sentinel.detach()
    return report
