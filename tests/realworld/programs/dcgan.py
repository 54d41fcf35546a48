"""A small GAN trained with two optimizers, the DCGAN-example way.

Modelled on: pytorch/examples ``dcgan/main.py`` (``netD.zero_grad()``; ``errD_real`` on real
data with ``real_label``; ``fake = netG(noise)``; ``errD_fake`` on ``netD(fake.detach())``;
``optimizerD.step()``; then ``netG.zero_grad()``, ``errG = criterion(netD(fake), real_label)``,
``optimizerG.step()``; ``nn.BCELoss`` after a final ``Sigmoid``; ``Adam(lr=2e-4,
betas=(0.5, 0.999))`` for both nets; ``weights_init`` with N(0, 0.02)). Fully-connected nets
instead of transposed convolutions. The sentinel watches both nets, attached once to a
container holding them, with both optimizers.

Data: 2-D points on a ring of radius 2; the generator maps 4-D noise to 2-D points.
"""

from __future__ import annotations

from typing import Optional

import torch
from realworld.harness import Bug
from torch import nn

import torch_sentinel

MODELLED_ON = "pytorch/examples dcgan/main.py"
HEALTHY_XFAIL: Optional[str] = None
#: Adversarial losses are not expected to fall: the healthy run must be quiet, not "learn".
ADVERSARIAL = True
BUGS = {
    "optimizerG_over_netD": Bug("optimizerG = optim.Adam(netD.parameters(), ...)",
                                "unregistered_parameter", module="netG"),
    "no_netG_zero_grad": Bug("netG.zero_grad() deleted before the generator update",
                             "missing_zero_grad"),
    "netG_eval": Bug("netG.eval() left on from sampling with fixed_noise", "eval_mode_training",
                     module="netG", onset=11),
}

NZ = 4


def weights_init(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        nn.init.normal_(m.weight, 0.0, 0.2)
        nn.init.zeros_(m.bias)
    elif isinstance(m, nn.BatchNorm1d):
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


def make_nets() -> tuple[nn.Module, nn.Module]:
    net_g = nn.Sequential(nn.Linear(NZ, 32), nn.BatchNorm1d(32), nn.ReLU(True),
                          nn.Linear(32, 32), nn.BatchNorm1d(32), nn.ReLU(True), nn.Linear(32, 2))
    net_d = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2, inplace=True),
                          nn.Linear(32, 32), nn.LeakyReLU(0.2, inplace=True),
                          nn.Linear(32, 1), nn.Sigmoid())
    net_g.apply(weights_init)
    net_d.apply(weights_init)
    return net_g, net_d


def real_batch(n: int, g: torch.Generator) -> torch.Tensor:
    angle = 2 * torch.pi * torch.rand(n, generator=g)
    return torch.stack([angle.cos(), angle.sin()], 1) * 2 + 0.05 * torch.randn(n, 2, generator=g)


def run(bug: Optional[str] = None, log_dir: Optional[str] = None) -> list[float]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    net_g, net_d = make_nets()
    gan = nn.ModuleDict({"netG": net_g, "netD": net_d})
    criterion = nn.BCELoss()
    fixed_noise = torch.randn(64, NZ, generator=g)
    optimizer_d = torch.optim.Adam(net_d.parameters(), lr=2e-3, betas=(0.5, 0.999))
    g_params = net_d.parameters() if bug == "optimizerG_over_netD" else net_g.parameters()
    optimizer_g = torch.optim.Adam(g_params, lr=2e-3, betas=(0.5, 0.999))
    losses: list[float] = []
    with torch_sentinel.attach(gan, [optimizer_d, optimizer_g], log_dir=log_dir):
        for i in range(60):
            real = real_batch(64, g)
            label = torch.full((64,), 1.0)
            net_d.zero_grad()
            err_d_real = criterion(net_d(real).view(-1), label)
            err_d_real.backward()
            fake = net_g(torch.randn(64, NZ, generator=g))
            err_d_fake = criterion(net_d(fake.detach()).view(-1), label.fill_(0.0))
            err_d_fake.backward()
            optimizer_d.step()
            if bug != "no_netG_zero_grad":
                net_g.zero_grad()
            err_g = criterion(net_d(fake).view(-1), label.fill_(1.0))
            err_g.backward()
            optimizer_g.step()
            losses.append(err_g.item())
            if i == 10:  # a look at the samples, as the example does every 100 iterations
                net_g.eval()
                with torch.no_grad():
                    net_g(fixed_noise)
                if bug != "netG_eval":
                    net_g.train()
    return losses
