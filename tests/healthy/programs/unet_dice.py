"""Binary segmentation with a small U-Net, BCE + Dice loss, RMSprop, gradient clipping and ReduceLROnPlateau.

Modelled on: milesial/Pytorch-UNet (https://github.com/milesial/Pytorch-UNet, ``unet/unet_parts.py``
``DoubleConv`` / ``Down`` / ``Up`` with bilinear upsampling and skip concatenation, ``OutConv``;
``train.py``: ``optim.RMSprop(lr, weight_decay=1e-8, momentum=0.999, foreach=True)``,
``ReduceLROnPlateau(optimizer, "max", patience=5)`` stepped on the validation Dice score,
``loss = BCEWithLogitsLoss(pred, mask) + dice_loss(sigmoid(pred), mask)`` for one class,
``clip_grad_norm_(model.parameters(), 1.0)``, lr 1e-5), two levels deep and 8 channels wide
here. Images: 24x24, noisy discs and squares of random size and place on
a textured background; the mask is the shape.

Why it is healthy: at lr 1e-5 with momentum 0.999 the loss falls slowly but steadily over the
whole run (from ~1.3 to ~0.15); the validation Dice (every 20 steps) rises, so the plateau
scheduler does not cut the rate.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

import torch_sentinel

MODELLED_ON = "https://github.com/milesial/Pytorch-UNet/blob/master/train.py"
SIZE, BATCH = 24, 8


class DoubleConv(nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.double_conv = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False), nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True),
            nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False), nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.double_conv(x)


class Down(nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.maxpool_conv = nn.Sequential(nn.MaxPool2d(2), DoubleConv(in_channels, out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.maxpool_conv(x)


class Up(nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
        self.conv = DoubleConv(in_channels, out_channels)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([x2, self.up(x1)], dim=1))


class UNet(nn.Module):
    def __init__(self, n_channels: int = 1, n_classes: int = 1) -> None:
        super().__init__()
        self.inc = DoubleConv(n_channels, 8)
        self.down1 = Down(8, 16)
        self.down2 = Down(16, 16)
        self.up1 = Up(32, 8)
        self.up2 = Up(16, 8)
        self.outc = nn.Conv2d(8, n_classes, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        return self.outc(self.up2(self.up1(x3, x2), x1))


def dice_coeff(input: torch.Tensor, target: torch.Tensor, epsilon: float = 1e-6) -> torch.Tensor:
    inter = 2 * (input * target).sum(dim=(-1, -2))
    sets_sum = input.sum(dim=(-1, -2)) + target.sum(dim=(-1, -2))
    sets_sum = torch.where(sets_sum == 0, inter, sets_sum)
    return ((inter + epsilon) / (sets_sum + epsilon)).mean()


def dice_loss(input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return 1 - dice_coeff(input, target)


def shapes(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    r = torch.arange(float(SIZE))
    yy, xx = torch.meshgrid(r, r, indexing="ij")
    cy, cx = (torch.rand(2, n, 1, 1, generator=g) * (SIZE - 8) + 4).unbind(0)
    radius = torch.rand(n, 1, 1, generator=g) * 4 + 3
    disc = ((yy - cy) ** 2 + (xx - cx) ** 2).sqrt() < radius
    square = ((yy - cy).abs() < radius * 0.8) & ((xx - cx).abs() < radius * 0.8)
    masks = torch.where(torch.rand(n, 1, 1, generator=g) < 0.5, disc, square).float()
    texture = 0.3 * torch.sin(xx * 0.7 + torch.rand(n, 1, 1, generator=g) * 6)
    return (masks + texture + 0.4 * torch.randn(n, SIZE, SIZE, generator=g)).unsqueeze(1), masks


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    val_images, val_masks = shapes(32, g)
    model = UNet()
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-5, weight_decay=1e-8, momentum=0.999, foreach=True)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, "max", patience=5)
    criterion = nn.BCEWithLogitsLoss()
    sentinel = torch_sentinel.attach(model, optimizer, log_dir=log_dir)
    model.train()
    for step in range(steps):
        images, true_masks = shapes(BATCH, g)
        masks_pred = model(images)
        loss = criterion(masks_pred.squeeze(1), true_masks)
        loss += dice_loss(F.sigmoid(masks_pred.squeeze(1)), true_masks)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if progress is not None:
            progress.append(loss.item())
        if step % 20 == 19:
            model.eval()
            with torch.no_grad():
                val_score = dice_coeff((torch.sigmoid(model(val_images).squeeze(1)) > 0.5).float(), val_masks)
            model.train()
            scheduler.step(val_score)
    report = sentinel.report()
    sentinel.detach()
    return report
