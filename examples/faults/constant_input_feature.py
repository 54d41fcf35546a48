"""Fault: two tabular input columns are constant (a join that filled them with a default), so
standardizing them divides by a zero std and they carry no signal.

Source pattern: the seeds' "division by zero: a constant feature has std 0"; Kaggle/StackOverflow
"NaN after StandardScaler on a constant column".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "unnormalized_input", "boundary": "data", "module": None}


def run(steps: int = 25, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for _ in range(steps):
            x = torch.randn(32, 8)
            x[:, 5] = 0.0  # the bug: constant columns
            x[:, 6] = 1.0
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
            opt.step()
        return sentinel.report()
