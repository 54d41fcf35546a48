"""A severity grader with a single output logit is trained with ``BCEWithLogitsLoss`` on the grade
index (0-4) as a float: the shapes match, so nothing fails, but binary cross-entropy is defined
for targets in [0, 1], and for grades above 1 the loss is unbounded below: the logits run off to
+inf and the loss goes negative. The fix: a multi-class head with ``CrossEntropyLoss`` on the
indices (or targets scaled into [0, 1]).

Source: pytorch/pytorch#110865 "BCEWithLogitsLoss: Check if labels within zero and one"
("calling the loss function with targets not contained within the interval [0,1] successfully
computes values ... this can happen if multi-class labels and predictions (i.e. 0,1,2,...,n) are
erroneously used with BCEWithLogitsLoss ... their shape will be identical"; a maintainer agreed
to add the check), https://github.com/pytorch/pytorch/issues/110865 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/pytorch/pytorch/issues/110865"
CLASS = "binary targets outside [0, 1]"
KIND, MODULE, CAUSE, ONSET = "invalid_target", None, None, 0


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1 if bug else 5))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(40):
            x = torch.randn(32, 12, generator=g)
            grade = (x[:, :3].sum(1) + 2.5).clamp(0, 4.99).long()  # severity 0-4
            opt.zero_grad()
            if bug:  # the bug: the grade index as a BCE target
                loss = nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(1), grade.float())
            else:
                loss = nn.functional.cross_entropy(model(x), grade)
            loss.backward()
            opt.step()
            watch(s)
        return s.report()
