"""A medical segmenter is trained with ``BCEWithLogitsLoss`` on label masks read from PNG files
as 0/255 instead of 0/1. Binary cross-entropy is defined for targets in [0, 1]; with a target of
255 the loss is 255 softplus(-z) - 254 softplus(z), unbounded below as the logit z grows, so it
goes negative and keeps falling while the masks are never learned. ``BCEWithLogitsLoss`` does not check the
target's range. The fix: divide the masks by 255 ("Do normalisation on the read process").

Source: MontaEllis/Pytorch-Medical-Segmentation#8 "Why is the value of BCEWithLogitsLoss
negative?" ("since your labels are not 0/1"; "your label is most likely a png image. Do
normalisation on the read process"), https://github.com/MontaEllis/Pytorch-Medical-Segmentation/issues/8 ;
milesial/Pytorch-UNet#78 "When i run this code, get loss is negative??" ("please ensure mask is
0-1, not 0-255"), https://github.com/milesial/Pytorch-UNet/issues/78 (there with ``BCELoss``,
which torch 2.13 now refuses with an error: ``BCEWithLogitsLoss`` still accepts it).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/MontaEllis/Pytorch-Medical-Segmentation/issues/8; https://github.com/milesial/Pytorch-UNet/issues/78"
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
            png_mask = (img > 0.6).to(torch.uint8) * 255  # as read from a mask PNG
            mask = png_mask.float() if bug else png_mask.float() / 255  # the bug: no / 255
            opt.zero_grad()
            criterion(model(img), mask).backward()
            opt.step()
            watch(s)
        return s.report()
