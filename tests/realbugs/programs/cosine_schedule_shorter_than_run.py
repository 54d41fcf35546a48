"""A ``CosineAnnealingLR`` stepped once per epoch is built with ``T_max`` shorter than the number
of epochs: the learning rate reaches ``eta_min = 0`` at epoch ``T_max``, stays exactly 0 for that
whole epoch (every optimizer step of it changes nothing), and then climbs back up, because the
cosine continues past ``T_max``. The fix: ``T_max`` equal to the number of epochs.

Source: CodefyUI/CodefyUI#205 "LRScheduler.T_max must match TrainingLoop.epochs" ("The inverse
(T_max smaller than epochs) is worse in a different way: CosineAnnealingLR continues past T_max
and the learning rate climbs back up"), https://github.com/CodefyUI/CodefyUI/issues/205 ;
lucidrains/imagen-pytorch#71 "CosineAnnealingLR T_max argument bug" (T_max given the warm-up
steps, fixed), https://github.com/lucidrains/imagen-pytorch/issues/71 .
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import nn

import torch_sentinel
from torch_sentinel import Finding

SOURCE = "https://github.com/CodefyUI/CodefyUI/issues/205; https://github.com/lucidrains/imagen-pytorch/issues/71"
CLASS = "learning-rate schedule at exactly 0 for a whole epoch"
KIND, MODULE, CAUSE, ONSET = "no_update", "", None, 30
EPOCHS, BATCHES = 6, 10


def contradicts(f: Finding) -> Optional[str]:
    """The learning rate is 0 for steps 30-39 only and rises again from step 40."""
    if "any more" in f.message:
        return "says no parameter can move any more, but the lr rises again from step 40"
    return None


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=3 if bug else EPOCHS)  # the bug: T_max 3 < 6 epochs
    g = torch.Generator().manual_seed(1)
    x_all = torch.randn(640, 10, generator=g)
    y_all = (x_all[:, :3] + 0.3 * x_all[:, 3:6]).argmax(1)
    with torch_sentinel.attach(model, opt) as s:
        for _epoch in range(EPOCHS):
            for _ in range(BATCHES):
                idx = torch.randint(0, 640, (64,), generator=g)
                opt.zero_grad()
                nn.functional.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
                opt.step()
                watch(s)
            sched.step()
        return s.report()
