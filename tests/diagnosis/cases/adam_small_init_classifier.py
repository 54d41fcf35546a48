"""Healthy: Adam's first steps on a classifier head initialised very small.

torchvision's VGG initialises every ``nn.Linear`` of its classifier from N(0, 0.01) with zero
biases (``VGG._initialize_weights``); detectron2's box regressor uses N(0, 0.001)
(``FastRCNNOutputLayers``: ``nn.init.normal_(self.bbox_pred.weight, std=0.001)``). Adam's first
updates are about ``lr`` per element whatever the gradient's scale, so on weights of std 0.001
the first steps change each weight by about its own size: an update/weight ratio near 1 for a
few steps, until the weights have grown to the scale the task needs. The loss falls from the
start; nothing is wrong.

Source: issue 25 ("Adam's first steps on weights initialised very small");
https://github.com/pytorch/vision/blob/main/torchvision/models/vgg.py ;
https://github.com/facebookresearch/detectron2/blob/main/detectron2/modeling/roi_heads/fast_rcnn.py .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = ("https://github.com/pytorch/vision/blob/main/torchvision/models/vgg.py; "
          "https://github.com/facebookresearch/detectron2/blob/main/detectron2/modeling/roi_heads/fast_rcnn.py")
CLASS = "Adam's first steps on weights initialised very small"
KIND, MODULE, CAUSE, ONSET = None, None, None, 0


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    # a box/class head over pooled 32-d features, every Linear from N(0, 0.001) as detectron2's
    # regressor, zero biases
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 5))
    for m in model:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0, 0.001)
            nn.init.zeros_(m.bias)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    protos = torch.randn(5, 32, generator=g)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(60):
            y = torch.randint(0, 5, (32,), generator=g)
            x = protos[y] + 0.5 * torch.randn(32, 32, generator=g)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            watch(s)
        return s.report()
