"""A fine-tuning script uses ``StepLR(step_size=7, gamma=0.1)``, meant as "decay 10x every 7
epochs", but calls ``scheduler.step()`` inside the batch loop: the learning rate falls 10x every 7
iterations, is 10,000x below its start after 28 and 10^-10 of it after 70, and training stops
moving long before the first epoch ends. The fix: step the scheduler once per epoch.

Source: pytorch/tutorials#640 "Update transfer_learning_tutorial.py" ("scheduler.step() per epoch
not per batch", merged), https://github.com/pytorch/tutorials/pull/640 ; ivadomed/ivadomed#55
"Fix scheduler updating" ("Scheduler was incorrectly stepped in the batch loop instead of in the
epoch loop ... causing the LR to be updated after each batch"), https://github.com/ivadomed/ivadomed/pull/55 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/pytorch/tutorials/pull/640; https://github.com/ivadomed/ivadomed/pull/55"
CLASS = "scheduler stepped per batch: learning rate collapses"
#: the lr is 100x below its start from step 14 on
KIND, MODULE, CAUSE, ONSET = "update_ratio", None, None, 14
#: the finding must say the learning rate is too low
NEXT_CHECK = "raise_learning_rate"
EPOCHS, BATCHES = 4, 20


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 5))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.1)
    g = torch.Generator().manual_seed(1)
    x_all = torch.randn(1024, 32, generator=g)
    y_all = (x_all[:, :5] + 0.5 * x_all[:, 5:10]).argmax(1)
    with torch_sentinel.attach(model, opt) as s:
        for _epoch in range(EPOCHS):
            for _ in range(BATCHES):
                idx = torch.randint(0, 1024, (32,), generator=g)
                opt.zero_grad()
                nn.functional.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
                opt.step()
                watch(s)
                if bug:
                    sched.step()  # the bug: per batch
            if not bug:
                sched.step()
        return s.report()
