"""Image classification with mixup: every batch is a convex mix of two shuffled copies of itself.

Modelled on: facebookresearch/mixup-cifar10 ``train.py`` (https://github.com/facebookresearch/mixup-cifar10/blob/main/train.py:
``mixup_data(x, y, alpha)`` draws ``lam ~ Beta(alpha, alpha)`` and a permutation, ``mixed_x = lam *
x + (1 - lam) * x[index]``; ``mixup_criterion = lam * CE(pred, y_a) + (1 - lam) * CE(pred, y_b)``;
SGD lr 0.1, momentum 0.9, weight decay 1e-4, alpha 1, a ResNet). Here a small residual CNN
with BatchNorm on synthetic 3x12x12 images of five classes (colour and shape cues plus noise).

Why it is healthy: with ``lam`` drawn fresh each batch, the best achievable loss of a batch
depends on ``lam`` (a 50/50 mix cannot score below ln 2), so the training loss stays high and
jumps between batches; it still falls on average.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import nn

import torch_sentinel

MODELLED_ON = "https://github.com/facebookresearch/mixup-cifar10/blob/main/train.py"
CLASSES, BATCH, ALPHA = 5, 32, 1.0


class BasicBlock(nn.Module):
    def __init__(self, planes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + x)


class SmallResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = BasicBlock(16)
        self.linear = nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer1(torch.relu(self.bn1(self.conv1(x))))
        return self.linear(nn.functional.adaptive_avg_pool2d(out, 1).flatten(1))


def mixup_data(x: torch.Tensor, y: torch.Tensor, alpha: float, rng: np.random.Generator):
    lam = float(rng.beta(alpha, alpha)) if alpha > 0 else 1.0
    index = torch.as_tensor(rng.permutation(x.size(0)))
    return lam * x + (1 - lam) * x[index, :], y, y[index], lam


def mixup_criterion(criterion: nn.Module, pred: torch.Tensor, y_a: torch.Tensor, y_b: torch.Tensor, lam: float):
    return lam * criterion(pred, y_a) + (1 - lam) * criterion(pred, y_b)


def images(labels: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    colours = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [0, 1, 1]], dtype=torch.float32)
    r = torch.arange(12.0)
    yy, xx = torch.meshgrid(r, r, indexing="ij")
    ring = ((yy - 5.5) ** 2 + (xx - 5.5) ** 2).sqrt()
    shape = torch.stack([ring < 3, (ring > 3) & (ring < 5), yy < 6, xx < 6, (yy + xx) < 11]).float()
    x = colours[labels][:, :, None, None] * shape[labels][:, None]
    return x + 0.7 * torch.randn(len(labels), 3, 12, 12, generator=g)


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    net = SmallResNet()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    with torch_sentinel.attach(net, optimizer, log_dir=log_dir) as sentinel:
        net.train()
        for _ in range(steps):
            targets = torch.randint(0, CLASSES, (BATCH,), generator=g)
            inputs, targets_a, targets_b, lam = mixup_data(images(targets, g), targets, ALPHA, rng)
            outputs = net(inputs)
            loss = mixup_criterion(criterion, outputs, targets_a, targets_b, lam)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if progress is not None:
                progress.append(loss.item())
        return sentinel.report()
