"""A weighted binary cross-entropy for an imbalanced detector is written by hand as
``-w * y * log(p) - (1 - y) * log(1 - p)`` on ``p = sigmoid(logit)``. Once the model is confident
on an easy positive, its logit passes ~17 and float32's sigmoid returns exactly 1.0: log(1 - p) =
log(0) = -inf, multiplied by (1 - y) = 0 gives NaN, and the loss is NaN although nothing in the
model or the optimizer went wrong. The fix: clamp ``p`` into [1e-7, 1 - 1e-7] (what ``BCELoss``
does internally) or use ``binary_cross_entropy_with_logits``.

Source: "自定义pytorch损失函数使得训练过程中出现nan" (a custom weighted BCE
``- target * torch.log(pred) - (1-target) * torch.log(1-pred)`` gives nan/inf; fixed with
``torch.clamp(pred, min=1e-7, max=1-1e-7)``), https://e-com-net.com/article/1609698298044645376.htm ;
the ``nn.BCELoss`` documentation ("if either y_n = 0 or (1 - y_n) = 0, then we would be
multiplying 0 with infinity ... BCELoss clamps its log function outputs"),
https://pytorch.org/docs/stable/generated/torch.nn.BCELoss.html .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://e-com-net.com/article/1609698298044645376.htm; https://pytorch.org/docs/stable/generated/torch.nn.BCELoss.html"
CLASS = "log of 0 in a hand-written loss"
#: ONSET: the first step at which a positive sample's sigmoid is exactly 1.0 (measured with
#: ``bare.py``: the first non-finite loss)
KIND, MODULE, CAUSE, ONSET = "non_finite", None, "local_loss", 48


def weighted_bce(logit: torch.Tensor, y: torch.Tensor, bug: bool, pos_weight: float = 4.0) -> torch.Tensor:
    p = torch.sigmoid(logit)
    if not bug:
        p = p.clamp(1e-7, 1 - 1e-7)  # the fix
    return (-pos_weight * y * torch.log(p) - (1 - y) * torch.log(1 - p)).mean()


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=2e-2)
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(70):
            x = torch.randn(64, 16, generator=g)
            y = (x[:, 0] + x[:, 1] > 0.5).float()  # fewer positives than negatives, easy to separate
            opt.zero_grad()
            weighted_bce(model(x).squeeze(1), y, bug).backward()
            opt.step()
            watch(s)
        return s.report()
