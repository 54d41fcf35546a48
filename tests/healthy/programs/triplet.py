"""Metric learning with a triplet margin loss on an embedding network.

Modelled on: adambielski/siamese-triplet (https://github.com/adambielski/siamese-triplet):
``EmbeddingNet`` (conv, PReLU, max-pool, then fully connected layers to the embedding; 2-D
there, 16-D here), ``TripletNet`` running the one embedding net on anchor, positive and negative,
``TripletLoss`` with margin 1 (``relu(d(a, p) - d(a, n) + margin)`` on squared distances), Adam
at lr 1e-3 with ``StepLR(step_size=8, gamma=0.1)`` stepped per epoch. The data are ten classes
of noisy 1x10x10 images around class prototypes; triplets are drawn at random, as their
``TripletMNIST`` dataset does.

Why it is healthy: once most random triplets satisfy the margin, their loss is exactly 0, so
the batch loss falls towards zero and its size depends on how many hard triplets the batch
happens to hold.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

import torch_sentinel

MODELLED_ON = "https://github.com/adambielski/siamese-triplet/blob/master/networks.py"
CLASSES, BATCH, STEPS_PER_EPOCH = 10, 32, 30


class EmbeddingNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.convnet = nn.Sequential(nn.Conv2d(1, 16, 3), nn.PReLU(), nn.MaxPool2d(2, stride=2),
                                     nn.Conv2d(16, 32, 3), nn.PReLU(), nn.MaxPool2d(2, stride=2))
        self.fc = nn.Sequential(nn.Linear(32 * 1 * 1, 64), nn.PReLU(), nn.Linear(64, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.convnet(x).flatten(1))


class TripletNet(nn.Module):
    def __init__(self, embedding_net: EmbeddingNet) -> None:
        super().__init__()
        self.embedding_net = embedding_net

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, x3: torch.Tensor):
        return self.embedding_net(x1), self.embedding_net(x2), self.embedding_net(x3)


class TripletLoss(nn.Module):
    def __init__(self, margin: float) -> None:
        super().__init__()
        self.margin = margin

    def forward(self, anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        distance_positive = (anchor - positive).pow(2).sum(1)
        distance_negative = (anchor - negative).pow(2).sum(1)
        return F.relu(distance_positive - distance_negative + self.margin).mean()


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    prototypes = torch.randn(CLASSES, 1, 10, 10, generator=g)

    def draw(labels: torch.Tensor) -> torch.Tensor:
        return prototypes[labels] + 0.8 * torch.randn(len(labels), 1, 10, 10, generator=g)

    model = TripletNet(EmbeddingNet())
    loss_fn = TripletLoss(margin=1.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 8, gamma=0.1, last_epoch=-1)
    with torch_sentinel.attach(model, optimizer, log_dir=log_dir) as sentinel:
        for step in range(steps):
            anchor_label = torch.randint(0, CLASSES, (BATCH,), generator=g)
            negative_label = (anchor_label + torch.randint(1, CLASSES, (BATCH,), generator=g)) % CLASSES
            outputs = model(draw(anchor_label), draw(anchor_label), draw(negative_label))
            loss = loss_fn(*outputs)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % STEPS_PER_EPOCH == STEPS_PER_EPOCH - 1:
                scheduler.step()
            if progress is not None:
                progress.append(loss.item())
        return sentinel.report()
