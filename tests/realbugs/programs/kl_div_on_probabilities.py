"""A distillation loss compares student and teacher with ``F.kl_div(student.softmax(-1),
teacher.softmax(-1))``. ``kl_div`` expects its input as log-probabilities (the target as
probabilities): given probabilities, it computes sum t * (log t - p), which is not a divergence,
can go negative and does not pull the student towards the teacher. torch accepts it silently.
The fix: ``F.log_softmax`` for the input.

Source: lightly-ai/lightly#1341 "Fix PMSNLoss" ("Convert probabilities to log-space before KL
div"), https://github.com/lightly-ai/lightly/pull/1341 ; sebastian-hofstaetter/matchmaker#18
"typo in KLDivTeacherList?" (``self.kl(scores.softmax(-1), labels.softmax(-1))``),
https://github.com/sebastian-hofstaetter/matchmaker/issues/18 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/lightly-ai/lightly/pull/1341; https://github.com/sebastian-hofstaetter/matchmaker/issues/18"
CLASS = "log-probability loss fed probabilities"
KIND, MODULE, CAUSE, ONSET = "invalid_loss_input", None, None, 0


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 6)).requires_grad_(False)
    student = nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 6))
    opt = torch.optim.Adam(student.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(student, opt) as s:
        for _ in range(40):
            x = torch.randn(64, 16, generator=g)
            scores, labels = student(x), teacher(x) * 3
            inp = scores.softmax(-1) if bug else nn.functional.log_softmax(scores, dim=-1)  # the bug
            opt.zero_grad()
            nn.functional.kl_div(inp, labels.softmax(-1), reduction="batchmean").backward()
            opt.step()
            watch(s)
        return s.report()
