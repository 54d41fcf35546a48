"""A GAN whose generator loss is computed on the *detached* fake batch: the generator's
optimizer steps every iteration, but no gradient ever reaches the generator.

The discriminator step rightly uses ``D(fake.detach())``; the bug reuses that detached output
in the generator's loss (``errG = bce(D(fake_detached), ones)``), so ``errG.backward()`` reaches
only the discriminator (whose gradients the next ``zero_grad`` throws away) and the generator
never learns. Both networks are watched by one sentinel over an ``nn.ModuleDict`` with their two
optimizers, as the README advises. The fix: ``D(fake)`` in the generator's loss.

Source: nikhilsinghmus/image2reverb#37 "Is fake_spec.detach() in Generator training step
intentional?" (maintainer: "that .detach() should not be there for the generator step and is a
bug"), https://github.com/nikhilsinghmus/image2reverb/issues/37 ; wangle53/CSA-CDGAN#5 ("you
detach the 'pred_fake', so the loss cannot update anything"),
https://github.com/wangle53/CSA-CDGAN/issues/5 .
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import nn

import torch_sentinel
from torch_sentinel import Finding

SOURCE = "https://github.com/nikhilsinghmus/image2reverb/issues/37; https://github.com/wangle53/CSA-CDGAN/issues/5"
CLASS = "one network of a two-network loop never gets a gradient while its optimizer steps"
KIND, MODULE, CAUSE, ONSET = "no_gradient", "G", None, 0


def contradicts(f: Finding) -> Optional[str]:
    """The finding must say how the generator's loss was cut off from it: its forward ran with
    gradients on, so its output was detached (a list of possible cuts is not a diagnosis)."""
    if "detached" not in f.message:
        return "does not say how the loss was cut off from G (its output was detached)"
    return None


def real_batch(n: int, g: torch.Generator) -> torch.Tensor:
    angle = torch.randint(0, 8, (n,), generator=g).float() * (torch.pi / 4)
    return torch.stack([angle.cos(), angle.sin()], 1) * 2 + 0.05 * torch.randn(n, 2, generator=g)


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))
    D = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    optD = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optG = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    bce = nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(nn.ModuleDict({"G": G, "D": D}), [optD, optG]) as s:
        for _ in range(40):
            real = real_batch(64, g)
            fake = G(torch.randn(64, 8, generator=g))
            fake_detached = fake.detach()
            D.zero_grad()
            errD = bce(D(real), torch.ones(64, 1)) + bce(D(fake_detached), torch.zeros(64, 1))
            errD.backward()
            optD.step()
            G.zero_grad()
            errG = bce(D(fake_detached if bug else fake), torch.ones(64, 1))  # the bug: the detached fake
            errG.backward()
            optG.step()
            watch(s)
        return s.report()
