"""A point-cloud classifier returns ``F.log_softmax(x, dim=0)``: the normalisation runs over the
batch, not over the classes, so each row handed to ``nll_loss`` is not a log-probability
distribution over the classes and the loss compares samples with each other. torch accepts it
silently. The fix: ``dim=-1`` (the class dimension).

Source: fxia22/pointnet.pytorch#27 "Confusion about the usage of log_softmax function"
(``return F.log_softmax(x, dim=0), trans``; "Dim0 means the dimension of batch"; fixed in
master), https://github.com/fxia22/pointnet.pytorch/issues/27 ; DonkeyShot21/UNO#4 (log_softmax
over the batch dimension, fixed), https://github.com/DonkeyShot21/UNO/issues/4 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/fxia22/pointnet.pytorch/issues/27; https://github.com/DonkeyShot21/UNO/issues/4"
CLASS = "log-softmax over the batch dimension"
KIND, MODULE, CAUSE, ONSET = "invalid_loss_input", None, None, 0


class PointNetCls(nn.Module):
    def __init__(self, bug: bool) -> None:
        super().__init__()
        self.feat = nn.Sequential(nn.Conv1d(3, 32, 1), nn.ReLU(), nn.Conv1d(32, 64, 1), nn.ReLU())
        self.fc = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4))
        self.bug = bug

    def forward(self, pts: torch.Tensor) -> torch.Tensor:
        x = self.fc(self.feat(pts).max(dim=2).values)
        return nn.functional.log_softmax(x, dim=0 if self.bug else -1)  # the bug: dim=0


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = PointNetCls(bug)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(40):
            y = torch.randint(0, 4, (16,), generator=g)  # 4 shape classes
            stretch = torch.ones(16, 3)  # classes 0-2: elongated along x, y or z; class 3: round
            stretch[y < 3, y[y < 3]] = 3.0
            pts = torch.randn(16, 3, 64, generator=g) * stretch[:, :, None]
            opt.zero_grad()
            nn.functional.nll_loss(model(pts), y).backward()
            opt.step()
            watch(s)
        return s.report()
