"""A text classifier ends in ``F.softmax`` and is trained with ``nn.NLLLoss``: NLL expects
log-probabilities, so the loss is minus the target's probability, always in [-1, 0] ("the loss is
always negative"), and its gradient vanishes as soon as a class wins. torch accepts it silently.
The fix: ``log_softmax`` (or raw logits with ``CrossEntropyLoss``).

Source: AnubhavGupta3377/Text-Classification-Models-Pytorch#9 "NLLLoss" ("only softmax is provided
in model.py therefore, the loss is always negative"),
https://github.com/AnubhavGupta3377/Text-Classification-Models-Pytorch/issues/9 ;
clvrai/ACGAN-PyTorch#4 "Change Softmax to LogSoftmax to use NLLLoss",
https://github.com/clvrai/ACGAN-PyTorch/pull/4 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = ("https://github.com/AnubhavGupta3377/Text-Classification-Models-Pytorch/issues/9; "
          "https://github.com/clvrai/ACGAN-PyTorch/pull/4")
CLASS = "log-probability loss fed probabilities"
KIND, MODULE, CAUSE, ONSET = "invalid_loss_input", None, None, 0


class TextClassifier(nn.Module):
    def __init__(self, bug: bool) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(100, 16)
        self.fc = nn.Linear(16, 4)
        self.bug = bug

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        z = self.fc(self.embed(tokens))
        if self.bug:
            return nn.functional.softmax(z, dim=1)  # the bug: probabilities, not log-probabilities
        return nn.functional.log_softmax(z, dim=1)


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = TextClassifier(bug)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    criterion = nn.NLLLoss()
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(40):
            tokens = torch.randint(0, 100, (32, 12), generator=g)
            y = (tokens < 25).sum(1).clamp(max=3)  # class: how many "topic" tokens, capped
            opt.zero_grad()
            criterion(model(tokens), y).backward()
            opt.step()
            watch(s)
        return s.report()
