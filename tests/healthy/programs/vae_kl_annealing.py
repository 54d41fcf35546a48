"""A VAE whose KL term is switched on gradually (KL annealing): the training loss rises by design.

Modelled on: pytorch/examples ``vae/main.py`` (https://github.com/pytorch/examples/blob/main/vae/main.py):
``fc1 -> (fc21, fc22)`` encoder, reparameterisation, ``fc3 -> fc4 -> sigmoid`` decoder, summed
binary cross-entropy plus KL divergence, Adam at lr 1e-3; with the logistic KL-weight schedule of
timbmg/Sentence-VAE (https://github.com/timbmg/Sentence-VAE/blob/master/train.py,
``kl_anneal_function('logistic', step, k, x0)``, after Bowman et al. 2016), here centred on step
150 with k = 0.05. The data are 64-pixel binary images: one of 8 templates with 5% of the pixels flipped.

Why it is healthy: the loss the optimizer sees is ``BCE + beta(step) * KLD``. While beta climbs
from ~0 to 1, the weighted KL grows faster than the reconstruction falls, so the training loss
rises by about a quarter between steps ~90 and ~200 (the model first learns to use its latent
code while it is almost free, then pays for it), which is what annealing is for. The full
ELBO (``BCE + KLD``) ends far below where it starts.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

import torch_sentinel

MODELLED_ON = "https://github.com/pytorch/examples/blob/main/vae/main.py"
PIXELS, BATCH, K, X0 = 64, 32, 0.05, 150


class VAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(PIXELS, 128)
        self.fc21 = nn.Linear(128, 8)
        self.fc22 = nn.Linear(128, 8)
        self.fc3 = nn.Linear(8, 128)
        self.fc4 = nn.Linear(128, PIXELS)

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
        std = torch.exp(0.5 * logvar)
        return mu + torch.randn_like(std) * std

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z))))

    def forward(self, x: torch.Tensor):
        mu, logvar = self.encode(x)
        return self.decode(self.reparameterize(mu, logvar)), mu, logvar


def kl_anneal_function(step: int) -> float:
    return float(1 / (1 + math.exp(-K * (step - X0))))


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(1)
    g = torch.Generator().manual_seed(1)
    templates = (torch.rand(8, PIXELS, generator=g) > 0.5).float()
    model = VAE()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    sentinel = torch_sentinel.attach(model, optimizer, log_dir=log_dir)
    model.train()
    for step in range(steps):
        data = templates[torch.randint(0, 8, (BATCH,), generator=g)]
        flips = (torch.rand(BATCH, PIXELS, generator=g) < 0.05).float()
        data = (data - flips).abs()
        optimizer.zero_grad()
        recon, mu, logvar = model(data)
        bce = F.binary_cross_entropy(recon, data, reduction="sum")
        kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        loss = (bce + kl_anneal_function(step) * kld) / BATCH
        loss.backward()
        optimizer.step()
        if progress is not None:
            progress.append((bce + kld).item() / BATCH)
    report = sentinel.report()
    sentinel.detach()
    return report
