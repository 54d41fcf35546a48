"""Validation runs every few iterations inside the epoch and switches the model to eval mode;
``model.train()`` is only called at the start of the next epoch, so dropout and batch norm stay
in eval mode for the rest of the epoch.

Source: fartashf/vsepp#4 "Finish validation without running model.train()",
https://github.com/fartashf/vsepp/issues/4 ; facebookresearch/clevr-iep#22,
https://github.com/facebookresearch/clevr-iep/pull/22 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/fartashf/vsepp/issues/4; https://github.com/facebookresearch/clevr-iep/pull/22"
CLASS = "training continues in eval mode"
KIND, MODULE, CAUSE, ONSET = "eval_mode_training", "", None, 16


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x_all = torch.randn(512, 12, generator=g)
    y_all = (x_all[:, 0] > 0).long() + (x_all[:, 1] > 0.5).long()
    with torch_sentinel.attach(model, opt) as s:
        for _epoch in range(2):
            model.train()
            for it in range(30):
                idx = torch.randint(0, 512, (32,), generator=g)
                opt.zero_grad()
                nn.functional.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
                opt.step()
                watch(s)
                if it == 15:  # validate mid-epoch
                    model.eval()
                    with torch.no_grad():
                        val = nn.functional.cross_entropy(model(x_all[:128]), y_all[:128])
                    s.observe_validation(val)
                    if not bug:
                        model.train()  # the fix
        return s.report()
