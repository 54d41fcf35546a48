"""An image classifier trained the torchvision-reference way: label smoothing, SGD with
warm-up then cosine per iteration, gradient clipping and an EMA copy of the model.

Modelled on: pytorch/vision ``references/classification/train.py`` (``train_one_epoch``:
``criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)``,
``optimizer.zero_grad(); loss.backward(); nn.utils.clip_grad_norm_(model.parameters(),
args.clip_grad_norm); optimizer.step()``, ``model_ema.update_parameters(model)`` every
``model_ema_steps``; ``LinearLR`` warm-up chained to ``CosineAnnealingLR`` by ``SequentialLR``)
and ``references/classification/utils.py`` (``ExponentialMovingAverage(AveragedModel)``).

Data: 3x8x8 images whose class is set by a bright row (one of four positions).
"""

from __future__ import annotations

from typing import Optional

import torch
from realworld.harness import Bug
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import torch_sentinel

MODELLED_ON = "pytorch/vision references/classification/train.py (+ utils.py ExponentialMovingAverage)"
HEALTHY_XFAIL: Optional[str] = None
BUGS = {
    "zero_grad_after_backward": Bug("optimizer.zero_grad() moved between loss.backward() and step()",
                                    "no_update"),
    "dead_classifier_relu": Bug("nn.init.constant_(classifier[0].bias, -8.0) in the weight init",
                                "dead_relu", module="classifier.1"),
}


class SmallNet(nn.Module):
    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                                      nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d((4, 1)))
        self.classifier = nn.Sequential(nn.Linear(32, 32), nn.ReLU(inplace=True), nn.Linear(32, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def make_images(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.randint(0, 4, (n,), generator=g)
    x = torch.randn(n, 3, 8, 8, generator=g)
    x[torch.arange(n), :, 2 * y] += 1.5
    return x, y


def run(bug: Optional[str] = None, log_dir: Optional[str] = None) -> list[float]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model = SmallNet()
    if bug == "dead_classifier_relu":
        nn.init.constant_(model.classifier[0].bias, -8.0)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4,
                                nesterov=True)
    iters, warmup = 40, 5
    scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, milestones=[warmup], schedulers=[
        torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=warmup),
        torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=iters - warmup, eta_min=1e-3),
    ])
    model_ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    losses: list[float] = []
    with torch_sentinel.attach(model, optimizer, log_dir=log_dir):
        model.train()
        for i in range(iters):
            image, target = make_images(32, g)
            output = model(image)
            loss = criterion(output, target)
            if bug != "zero_grad_after_backward":
                optimizer.zero_grad()
            loss.backward()
            if bug == "zero_grad_after_backward":
                optimizer.zero_grad()
            nn.utils.clip_grad_norm_(model.parameters(), 2.0)
            optimizer.step()
            scheduler.step()
            if i % 4 == 0:
                model_ema.update_parameters(model)
            losses.append(loss.item())
    return losses
