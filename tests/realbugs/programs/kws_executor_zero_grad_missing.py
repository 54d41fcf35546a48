"""A keyword-spotting toolkit's training executor calls ``loss.backward()`` and
``optimizer.step()`` but never ``optimizer.zero_grad()``: every step applies the sum of all past
gradients. The maintainers confirmed the bug ("It's a bug, could you help to make a PR") and the
fix added ``optimizer.zero_grad()`` before ``loss.backward()``.

Source: wenet-e2e/wekws#72 "Questions about optimizer.zero_grad()", https://github.com/wenet-e2e/wekws/issues/72 ;
wenet-e2e/wekws#73 "[fix bug] add optimizer.zero_grad() in kws/utils/executor.py",
https://github.com/wenet-e2e/wekws/pull/73 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/wenet-e2e/wekws/issues/72; https://github.com/wenet-e2e/wekws/pull/73"
CLASS = "gradients accumulate across steps (zero_grad missing)"
KIND, MODULE, CAUSE, ONSET = "missing_zero_grad", None, "accumulating_gradients", 1


class KWSModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.GRU(20, 32, batch_first=True)
        self.classifier = nn.Linear(32, 1)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.backbone(feats)[0]).squeeze(-1)  # a logit per frame


def max_pooling_loss(logits: torch.Tensor, keyword: torch.Tensor) -> torch.Tensor:
    """wekws-style: the keyword is present if its most confident frame says so."""
    return nn.functional.binary_cross_entropy_with_logits(logits.max(1).values, keyword)


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = KWSModel()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, optimizer) as s:
        for _ in range(30):
            feats = torch.randn(16, 30, 20, generator=g)  # fbank frames
            keyword = (torch.rand(16, generator=g) > 0.5).float()
            feats[:, 12:16, :4] += 2.0 * keyword[:, None, None]  # the keyword's frames
            loss = max_pooling_loss(model(feats), keyword)
            if not bug:
                optimizer.zero_grad()  # the fix; the bug is this line missing
            loss.backward()
            optimizer.step()
            watch(s)
        return s.report()
