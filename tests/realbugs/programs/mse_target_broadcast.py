"""A regression head outputs shape (B,) (squeezed logits) while the labels have shape (B, 1):
``MSELoss`` broadcasts them to (B, B) and the model learns the batch mean, with only a
UserWarning ("Using a target size ... that is different to the input size").

Source: deepset-ai/FARM#229 "Using a target size (torch.Size([32, 1])) that is different to the
input size (torch.Size([32]))" (fixed in FARM#230: the logits were squeezed),
https://github.com/deepset-ai/FARM/issues/229 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/deepset-ai/FARM/issues/229"
CLASS = "loss input and target broadcast to a larger shape"
KIND, MODULE, CAUSE, ONSET = "loss_broadcast", None, None, 0


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    w = torch.randn(10, 1, generator=g)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(30):
            x = torch.randn(32, 10, generator=g)
            labels = x @ w  # (B, 1)
            out = model(x).squeeze(-1)  # (B,)
            target = labels if bug else labels.squeeze(-1)  # the bug: (B,) against (B, 1)
            opt.zero_grad()
            nn.functional.mse_loss(out, target).backward()
            opt.step()
            watch(s)
        return s.report()
