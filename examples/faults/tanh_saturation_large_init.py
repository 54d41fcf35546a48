"""Fault: hidden tanh units initialised with N(0, 1) weights over 128 inputs: pre-activations
have a std of ~11, so most units sit at +-1 where tanh is flat and almost no gradient passes.

Source pattern: Glorot & Bengio (2010) "saturated sigmoid/tanh units"; DeepDiagnosis
"saturated activation" (> 50% of inputs beyond +-5); StackOverflow "tanh network not learning
with randn init".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = {"kind": "saturation", "boundary": "forward", "module": "1"}


def run(steps: int = 25, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 64), nn.Tanh(), nn.Linear(64, 4))
    nn.init.normal_(model[0].weight, 0.0, 1.0)  # the bug: std 1 instead of ~1/sqrt(128)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=10) as sentinel:
        for _ in range(steps):
            x = torch.randn(32, 128)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
            opt.step()
        return sentinel.report()
