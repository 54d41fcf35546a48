"""A nested U-Net is trained with ``BCEWithLogitsLoss``; the augmentation pipeline normalises the
mask together with the image (mean 0.5, std 0.5), so the binary targets arrive in {-1, 1}. With a
target of -1 the loss is unbounded below and goes negative after a few epochs. torch accepts it
silently. The fix: apply the normalisation to the image only.

Source: bigmb/Unet-Segmentation-Pytorch-Nest-of-Unets#18 "Negative number occur in 'Loss'" ("I
have do the augment to mask, which cause mask's value to [-1, 1]. bce's target should be [0, 1]"),
https://github.com/bigmb/Unet-Segmentation-Pytorch-Nest-of-Unets/issues/18 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/bigmb/Unet-Segmentation-Pytorch-Nest-of-Unets/issues/18"
CLASS = "binary targets outside [0, 1]"
KIND, MODULE, CAUSE, ONSET = "invalid_target", None, None, 0


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 1, 3, padding=1))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    criterion = nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(40):
            img = torch.rand(4, 1, 16, 16, generator=g)
            mask = (img > 0.6).float()
            img = (img - 0.5) / 0.5
            if bug:
                mask = (mask - 0.5) / 0.5  # the bug: the image's normalisation applied to the mask
            opt.zero_grad()
            criterion(model(img), mask).backward()
            opt.step()
            watch(s)
        return s.report()
