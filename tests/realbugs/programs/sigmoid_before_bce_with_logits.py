"""A recommender head ends in ``torch.sigmoid`` and is trained with ``BCEWithLogitsLoss``, which
applies the sigmoid again: every prediction lands in [0.5, 0.73] and the loss does not converge.

Source: yudi-mars/daisyRec#15 "Do not need sigmoid because there is sigmoid in BCEWithLogitsLoss
... Otherwise loss does not converge", https://github.com/yudi-mars/daisyRec/pull/15 ;
cvg/glue-factory#89, https://github.com/cvg/glue-factory/issues/89 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/yudi-mars/daisyRec/pull/15; https://github.com/cvg/glue-factory/issues/89"
CLASS = "probabilities fed to a loss that expects logits"
KIND, MODULE, CAUSE, ONSET = "probabilities_as_logits", "", None, 0


class Scorer(nn.Module):
    def __init__(self, bug: bool) -> None:
        super().__init__()
        self.user = nn.Embedding(50, 8)
        self.item = nn.Embedding(80, 8)
        self.mlp = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
        self.bug = bug

    def forward(self, u: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        score = self.mlp(torch.cat([self.user(u), self.item(i)], -1)).squeeze(-1)
        return torch.sigmoid(score) if self.bug else score  # the bug: a sigmoid before the loss


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = Scorer(bug)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    criterion = nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(40):
            u, i = torch.randint(0, 50, (64,), generator=g), torch.randint(0, 80, (64,), generator=g)
            y = ((u + i) % 3 == 0).float()
            opt.zero_grad()
            criterion(model(u, i), y).backward()
            opt.step()
            watch(s)
        return s.report()
