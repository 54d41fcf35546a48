"""An RGB-D salient-object detector also predicts a depth map of shape (B, 1, H, W) and compares
it with the ground-truth depth of shape (B, H, W) through ``F.smooth_l1_loss``: the two broadcast
to (B, B, H, W), so every predicted map is compared with the depth of every image in the batch,
with only a UserWarning. The maintainer's fix: ``target.unsqueeze(1)``.

Source: jiwei0921/CoNet#3 "There is a difference between the target size and the input size in
smooth_l1_loss" (``Using a target size (torch.Size([2, 256, 256])) that is different to the input
size (torch.Size([2, 1, 256, 256]))``; "you can add this code target = target.unsqueeze(1)"),
https://github.com/jiwei0921/CoNet/issues/3 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/jiwei0921/CoNet/issues/3"
CLASS = "loss input and target broadcast to a larger shape"
KIND, MODULE, CAUSE, ONSET = "loss_broadcast", None, None, 0


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 1, 3, padding=1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(30):
            rgb = torch.rand(4, 3, 16, 16, generator=g)
            depth = rgb.mean(1) * 2 + 0.5  # (B, H, W), as loaded
            pred_depth = model(rgb)  # (B, 1, H, W)
            target = depth if bug else depth.unsqueeze(1)  # the bug: no channel dimension
            opt.zero_grad()
            nn.functional.smooth_l1_loss(pred_depth, target, reduction="sum").backward()
            opt.step()
            watch(s)
        return s.report()
