"""A small ResNet-style CNN trained the ImageNet-example way: SGD with momentum and weight
decay, ``StepLR`` stepped per epoch, ``train()``/``validate()`` alternating each epoch.

Modelled on: pytorch/examples ``imagenet/main.py`` (``SGD(lr=0.1, momentum=0.9,
weight_decay=1e-4)``, ``StepLR(optimizer, step_size=30, gamma=0.1)`` stepped after each epoch,
``train()`` starting with ``model.train()``, ``validate()`` with ``model.eval()`` under
``no_grad``, ``transforms.Normalize(mean, std)`` on the inputs). Epochs of 8 batches, a
step size of 2 epochs.

Data: 3x16x16 uint8 "photos" whose class is the colour channel with a brighter mean, with 15% of labels
redrawn at random; normalised with the
dataset mean/std, as ``transforms.ToTensor`` + ``Normalize`` would.
"""

from __future__ import annotations

from typing import Optional

import torch
from realworld.harness import Bug
from torch import nn
from torch.optim.lr_scheduler import StepLR

import torch_sentinel

MODELLED_ON = "pytorch/examples imagenet/main.py"
HEALTHY_XFAIL: Optional[str] = None
BUGS = {
    "no_normalize": Bug("the Normalize transform (and ToTensor's /255) left out: raw 0..255 pixels",
                        "unnormalized_input"),
    "steplr_gamma_zero": Bug("StepLR(optimizer, step_size=2, gamma=0.0)", "no_update", onset=16),
    "lr_x100": Bug("--lr 10 instead of 0.1", ("update_ratio", "diverging")),
}

MEAN = torch.tensor([110.0, 100.0, 90.0]).view(1, 3, 1, 1)
STD = torch.tensor([60.0, 60.0, 60.0]).view(1, 3, 1, 1)


class BasicBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + x)


class ResNet(nn.Module):
    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = BasicBlock(8)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer1(self.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def make_images(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.randint(0, 3, (n,), generator=g)
    img = torch.rand(n, 3, 16, 16, generator=g) * 120 + 40
    img[torch.arange(n), y] += 25
    flip = torch.rand(n, generator=g) < 0.15  # label noise: the loss has a floor, as on real data
    y = torch.where(flip, torch.randint(0, 3, (n,), generator=g), y)
    return img.round().clamp(0, 255).to(torch.uint8), y


def run(bug: Optional[str] = None, log_dir: Optional[str] = None) -> list[float]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    images, labels = make_images(8 * 32, g)
    val_images, val_labels = make_images(64, g)

    def transform(batch: torch.Tensor) -> torch.Tensor:
        if bug == "no_normalize":
            return batch.float()
        return (batch.float() - MEAN) / STD

    model = ResNet()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=10.0 if bug == "lr_x100" else 0.1,
                                momentum=0.9, weight_decay=1e-4)
    scheduler = StepLR(optimizer, step_size=2, gamma=0.0 if bug == "steplr_gamma_zero" else 0.1)
    losses: list[float] = []
    with torch_sentinel.attach(model, optimizer, log_dir=log_dir) as sentinel:
        for _epoch in range(5):
            model.train()  # train()
            for i in range(0, len(images), 32):
                output = model(transform(images[i:i + 32]))
                loss = criterion(output, labels[i:i + 32])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
            model.eval()  # validate()
            with torch.no_grad():
                val_loss = criterion(model(transform(val_images)), val_labels)
            sentinel.observe_validation(val_loss)
            scheduler.step()
    return losses
