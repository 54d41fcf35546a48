"""An in-domain GAN inversion trains an encoder E against a discriminator D through a frozen
generator; the D update calls ``D_loss.backward(); optimizer_D.step()`` without
``optimizer_D.zero_grad()``, so D's gradients pile up over every step (plus what E's adversarial
loss leaves in D), and each D step applies the sum of all past gradients. The fix (made by the
author): ``optimizer_D.zero_grad()`` before the D backward.

Source: Hsintien-Ng/idinvert_pytorch-reproduced#1 "optimizer_D.zero_grad() missing?" (author:
"You're right. Sorry I forgot to add it. I have fixed it."),
https://github.com/Hsintien-Ng/idinvert_pytorch-reproduced/issues/1 ; the loop in
``training/training_loop_encoder.py`` of that repository.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/Hsintien-Ng/idinvert_pytorch-reproduced/issues/1"
CLASS = "gradients accumulate across steps (zero_grad missing)"
KIND, MODULE, CAUSE, ONSET = "missing_zero_grad", "D", "accumulating_gradients", 1


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 16)).requires_grad_(False)  # pretrained, frozen
    E = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    D = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    optimizer_E = torch.optim.Adam(E.parameters(), lr=1e-3)
    optimizer_D = torch.optim.Adam(D.parameters(), lr=1e-3)
    softplus = nn.functional.softplus
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(nn.ModuleDict({"E": E, "D": D}), [optimizer_E, optimizer_D]) as s:
        for _ in range(40):
            x = G(torch.randn(32, 8, generator=g))  # images the generator can make
            x_rec = G(E(x))
            if not bug:
                optimizer_D.zero_grad()  # the fix; the bug is this line missing
            D_loss = softplus(-D(x)).mean() + softplus(D(x_rec.detach())).mean()
            D_loss.backward()
            optimizer_D.step()
            E_loss = ((x - x_rec) ** 2).mean() + 0.1 * softplus(-D(x_rec)).mean()
            optimizer_E.zero_grad()
            E_loss.backward()
            optimizer_E.step()
            watch(s)
        return s.report()
