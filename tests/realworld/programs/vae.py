"""A variational auto-encoder on binary images, the PyTorch VAE example's loop.

Modelled on: pytorch/examples ``vae/main.py`` (``VAE`` with ``fc1 -> relu -> fc21/fc22`` giving
``mu`` and ``logvar``, ``reparameterize``: ``std = torch.exp(0.5 * logvar); eps =
torch.randn_like(std); return mu + eps * std``, ``decode`` ending in ``torch.sigmoid``;
``loss_function`` = ``F.binary_cross_entropy(recon_x, x, reduction='sum')`` plus ``KLD = -0.5 *
torch.sum(1 + logvar - mu.pow(2) - logvar.exp())``; ``optim.Adam(lr=1e-3)``). Smaller sizes.

Data: 8x8 binary images drawn from four stroke prototypes with 5% of the pixels flipped.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from realworld.harness import Bug
from torch import nn

import torch_sentinel

MODELLED_ON = "pytorch/examples vae/main.py"
HEALTHY_XFAIL: Optional[str] = None
BUGS = {
    "sqrt_of_logvar": Bug("std = logvar.sqrt() (the log-variance read as a variance)", "non_finite",
                          module="", nonfinite=True),
    "sigmoid_into_bce_with_logits": Bug(
        "F.binary_cross_entropy_with_logits(recon_x, x) on the sigmoid output of decode()",
        "probabilities_as_logits", module=""),
}


class VAE(nn.Module):
    def __init__(self, bug: Optional[str] = None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc21 = nn.Linear(32, 4)
        self.fc22 = nn.Linear(32, 4)
        self.fc3 = nn.Linear(4, 32)
        self.fc4 = nn.Linear(32, 64)
        self.bug = bug

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
        std = logvar.sqrt() if self.bug == "sqrt_of_logvar" else torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z))))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mu, logvar = self.encode(x.view(-1, 64))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


def loss_function(recon_x: torch.Tensor, x: torch.Tensor, mu: torch.Tensor, logvar: torch.Tensor,
                  bug: Optional[str]) -> torch.Tensor:
    if bug == "sigmoid_into_bce_with_logits":
        bce = F.binary_cross_entropy_with_logits(recon_x, x.view(-1, 64), reduction="sum")
    else:
        bce = F.binary_cross_entropy(recon_x, x.view(-1, 64), reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld


def make_images(n: int, g: torch.Generator) -> torch.Tensor:
    protos = torch.zeros(4, 8, 8)
    protos[0, 3:5, :] = 1
    protos[1, :, 3:5] = 1
    protos[2] = torch.eye(8)
    protos[3] = torch.eye(8).flip(0)
    x = protos[torch.randint(0, 4, (n,), generator=g)]
    flip = torch.rand(n, 8, 8, generator=g) < 0.05
    return torch.where(flip, 1 - x, x)


def run(bug: Optional[str] = None, log_dir: Optional[str] = None) -> list[float]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model = VAE(bug)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses: list[float] = []
    with torch_sentinel.attach(model, optimizer, log_dir=log_dir):
        model.train()
        for _batch_idx in range(40):
            data = make_images(32, g)
            optimizer.zero_grad()
            recon_batch, mu, logvar = model(data)
            loss = loss_function(recon_batch, data, mu, logvar, bug)
            loss.backward()
            optimizer.step()
            losses.append(loss.item() / len(data))
    return losses
