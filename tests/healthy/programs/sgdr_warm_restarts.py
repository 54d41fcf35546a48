"""SGD with cosine annealing and warm restarts (SGDR): the learning rate jumps back up every cycle.

Modelled on: the ``CosineAnnealingWarmRestarts`` recipe in the PyTorch docs
(https://pytorch.org/docs/stable/generated/torch.optim.lr_scheduler.CosineAnnealingWarmRestarts.html:
``scheduler.step(epoch + i / iters)`` inside the batch loop) and the SGDR paper's CIFAR setup
(Loshchilov & Hutter 2017, https://github.com/loshchil/SGDR): SGD with Nesterov momentum 0.9,
weight decay 5e-4, lr 0.1, T_0 = 1 epoch, T_mult = 2, a small BatchNorm CNN. Synthetic images:
four classes, each a noisy oriented stripe pattern.

Why it is healthy: at each restart (steps 30, 90, 210) the learning rate returns to its
maximum; the loss bumps up for a few steps (by ~10% in the 10-step mean after steps 90 and 210)
before it falls again. The classes are hard to tell apart under the noise, so the loss stays
well above zero.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

MODELLED_ON = "https://pytorch.org/docs/stable/generated/torch.optim.lr_scheduler.CosineAnnealingWarmRestarts.html"
ITERS_PER_EPOCH, BATCH, CLASSES = 30, 32, 4


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(32, CLASSES),
    )


def stripes(labels: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    r = torch.arange(12.0)
    yy, xx = torch.meshgrid(r, r, indexing="ij")
    angle = labels.float()[:, None, None] * (torch.pi / CLASSES)
    phase = 2 * torch.pi * torch.rand(len(labels), 1, 1, generator=g)
    wave = torch.sin(0.9 * (xx * torch.cos(angle) + yy * torch.sin(angle)) + phase)
    return (wave + 2.0 * torch.randn(wave.shape, generator=g)).unsqueeze(1)


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = make_model()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0=1, T_mult=2, eta_min=1e-4)
    sentinel = torch_sentinel.attach(model, optimizer, log_dir=log_dir)
    for i in range(steps):
        epoch, it = divmod(i, ITERS_PER_EPOCH)
        labels = torch.randint(0, CLASSES, (BATCH,), generator=g)
        inputs = stripes(labels, g)
        optimizer.zero_grad()
        loss = criterion(model(inputs), labels)
        loss.backward()
        optimizer.step()
        scheduler.step(epoch + (it + 1) / ITERS_PER_EPOCH)
        if progress is not None:
            progress.append(loss.item())
    report = sentinel.report()
    sentinel.detach()
    return report
