"""A semi-supervised (VAT) training script calls ``model.train()`` once before the loop and runs
``test()`` every few iterations; ``test()`` switches the model to eval mode and nothing switches it
back, so from the first test on, batch norm uses its running statistics and dropout is off for
the rest of training. The fix: ``model.train()`` at the top of every training iteration.

Source: lyakaap/VAT-pytorch#7 "model.train() not being reset after test() called" ("You need to
move model.train() inside your training loop"), https://github.com/lyakaap/VAT-pytorch/issues/7 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/lyakaap/VAT-pytorch/issues/7"
CLASS = "training continues in eval mode"
KIND, MODULE, CAUSE, ONSET = "eval_mode_training", "", None, 10


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x_all = torch.randn(1024, 20, generator=g)
    y_all = x_all[:, :4].argmax(1)

    def test() -> None:
        model.eval()
        with torch.no_grad():
            acc = (model(x_all[:256]).argmax(1) == y_all[:256]).float().mean()
        s.note(f"test accuracy {float(acc):.3f}")

    model.train()
    with torch_sentinel.attach(model, opt) as s:
        for it in range(40):
            if not bug:
                model.train()  # the fix
            idx = torch.randint(0, 1024, (32,), generator=g)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
            opt.step()
            watch(s)
            if it % 10 == 9:
                test()
        return s.report()
