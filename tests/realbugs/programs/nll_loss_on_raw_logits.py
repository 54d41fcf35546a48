"""A per-pixel classifier (a 1x1 convolution head, as in the ``nn.NLLLoss`` documentation's 2-D
example) feeds its raw scores to ``nll_loss``. NLL expects log-probabilities over the class
dimension; on raw scores it only pushes the target score up without bound, the loss goes
negative and keeps falling, and nothing teaches the other classes down. torch accepts it silently.

The documentation example itself had the bug: its second example passed the convolution's output
straight to ``NLLLoss`` ("Without this activation, the second example loss was sometimes
negative"); the fix added ``LogSoftmax(dim=1)`` before the loss.

Source: pytorch/pytorch#12703 "Fix missing final activation in NLLLoss second example",
https://github.com/pytorch/pytorch/pull/12703 ; torch/nn#1078 "ClassNLLCriterion loss gets more
negative over training iterations", https://github.com/torch/nn/issues/1078 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/pytorch/pytorch/pull/12703; https://github.com/torch/nn/issues/1078"
CLASS = "NLL loss fed unnormalised scores (no log-softmax)"
KIND, MODULE, CAUSE, ONSET = "invalid_loss_input", None, None, 0


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 4, 1))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(40):
            x = torch.randn(8, 3, 8, 8, generator=g)
            target = x.argmax(1) + (x[:, 0] > 1).long()  # 4 classes per pixel
            scores = model(x)  # (N, C, H, W)
            inp = scores if bug else nn.functional.log_softmax(scores, dim=1)  # the bug: no log-softmax
            opt.zero_grad()
            nn.functional.nll_loss(inp, target).backward()
            opt.step()
            watch(s)
        return s.report()
