"""The one-cycle policy: the learning rate climbs to a high peak and anneals, momentum cycles inversely.

Modelled on: fast.ai's ``fit_one_cycle`` as ported to plain PyTorch by ``torch.optim.lr_scheduler.OneCycleLR``
(https://pytorch.org/docs/stable/generated/torch.optim.lr_scheduler.OneCycleLR.html: built with
``total_steps``, ``scheduler.step()`` after every batch) and David Page's cifar10-fast
(https://github.com/davidcpage/cifar10-fast): SGD with Nesterov momentum, weight decay 5e-4, peak
lr 0.4 reached at 30% of the run (``pct_start=0.3``), momentum cycling 0.95 -> 0.85 -> 0.95,
label smoothing 0.2, a BatchNorm CNN. Synthetic images: six classes of noisy blob positions.

Why it is healthy: the peak learning rate is large by design; BatchNorm keeps the
network's function scale-free, so weights feeding a BatchNorm grow and shrink without harm; the
loss falls unevenly around the peak and steadily during the anneal.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

MODELLED_ON = "https://github.com/davidcpage/cifar10-fast"
BATCH, CLASSES = 32, 6


def conv_bn(c_in: int, c_out: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())


def make_model() -> nn.Module:
    return nn.Sequential(conv_bn(3, 16), conv_bn(16, 32), nn.MaxPool2d(2), conv_bn(32, 32), nn.AdaptiveMaxPool2d(1),
                         nn.Flatten(), nn.Linear(32, CLASSES, bias=False))


def blobs(labels: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    centres = torch.tensor([[2, 2], [2, 9], [9, 2], [9, 9], [5, 5], [2, 5]], dtype=torch.float32)[labels]
    r = torch.arange(12.0)
    yy, xx = torch.meshgrid(r, r, indexing="ij")
    d2 = (yy - centres[:, 0, None, None]) ** 2 + (xx - centres[:, 1, None, None]) ** 2
    colour = torch.rand(len(labels), 3, 1, 1, generator=g) + 0.5
    return colour * torch.exp(-d2 / 4).unsqueeze(1) + 0.5 * torch.randn(len(labels), 3, 12, 12, generator=g)


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = make_model()
    criterion = nn.CrossEntropyLoss(label_smoothing=0.2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.4, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.4, total_steps=steps, pct_start=0.3,
                                                    base_momentum=0.85, max_momentum=0.95)
    with torch_sentinel.attach(model, optimizer, log_dir=log_dir) as sentinel:
        for _ in range(steps):
            labels = torch.randint(0, CLASSES, (BATCH,), generator=g)
            optimizer.zero_grad()
            loss = criterion(model(blobs(labels, g)), labels)
            loss.backward()
            optimizer.step()
            scheduler.step()
            if progress is not None:
                progress.append(loss.item())
        return sentinel.report()
