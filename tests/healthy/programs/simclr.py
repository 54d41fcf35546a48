"""SimCLR: two augmented views per image, a projection head and the InfoNCE (NT-Xent) loss.

Modelled on: sthalles/SimCLR ``simclr.py`` (https://github.com/sthalles/SimCLR/blob/master/simclr.py):
``info_nce_loss`` builds the 2N x 2N cosine-similarity matrix of the L2-normalised features,
drops the diagonal, puts each positive in column 0 and the negatives after it, divides by the
temperature (0.07) and applies cross-entropy against label 0; the encoder is a small CNN with
BatchNorm (ResNet-18 there) followed by the MLP projection head; Adam at lr 3e-4 with weight
decay 1e-4. The images are synthetic: 32 random 12x12 prototypes; an augmentation is a random
shift, a random contrast and pixel noise.

Why it is healthy: the loss starts near ln(2N - 1) and falls as the two views of each image
move together; it stays well above zero, since every batch brings new negatives.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

import torch_sentinel

MODELLED_ON = "https://github.com/sthalles/SimCLR/blob/master/simclr.py"
BATCH, TEMPERATURE, N_VIEWS = 32, 0.07, 2


class ResNetSimCLR(nn.Module):
    def __init__(self, out_dim: int = 32) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.head = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def info_nce_loss(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.cat([torch.arange(BATCH) for _ in range(N_VIEWS)], dim=0)
    labels = (labels.unsqueeze(0) == labels.unsqueeze(1)).float()
    features = F.normalize(features, dim=1)
    similarity_matrix = torch.matmul(features, features.T)
    mask = torch.eye(labels.shape[0], dtype=torch.bool)
    labels = labels[~mask].view(labels.shape[0], -1)
    similarity_matrix = similarity_matrix[~mask].view(similarity_matrix.shape[0], -1)
    positives = similarity_matrix[labels.bool()].view(labels.shape[0], -1)
    negatives = similarity_matrix[~labels.bool()].view(similarity_matrix.shape[0], -1)
    logits = torch.cat([positives, negatives], dim=1) / TEMPERATURE
    return logits, torch.zeros(logits.shape[0], dtype=torch.long)


def augment(images: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    n = images.shape[0]
    dx, dy = (int(v) for v in torch.randint(-2, 3, (2,), generator=g))
    shifted = torch.roll(images, shifts=(dx, dy), dims=(2, 3))
    contrast = 0.6 + 0.8 * torch.rand(n, 1, 1, 1, generator=g)
    return shifted * contrast + 0.3 * torch.randn(shifted.shape, generator=g)


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    prototypes = torch.randn(32, 1, 12, 12, generator=g)
    model = ResNetSimCLR()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4, weight_decay=1e-4)
    criterion = nn.CrossEntropyLoss()
    sentinel = torch_sentinel.attach(model, optimizer, log_dir=log_dir)
    for _ in range(steps):
        images = prototypes[torch.randint(0, 32, (BATCH,), generator=g)]
        images = images + 0.5 * torch.randn(images.shape, generator=g)  # each draw is a new image
        views = torch.cat([augment(images, g), augment(images, g)], dim=0)
        logits, labels = info_nce_loss(model(views))
        loss = criterion(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if progress is not None:
            progress.append(loss.item())
    return sentinel.report()
