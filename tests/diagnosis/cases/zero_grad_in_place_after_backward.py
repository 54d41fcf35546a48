"""``optimizer.zero_grad(set_to_none=False)`` between ``backward()`` and ``step()``: the gradients
are zeroed in place after they were computed, every step applies a zero gradient, and the
weights never change. The loss stays where it started (the symptom is a plateau; the cause is
that the update is always zero).

``set_to_none=False`` was the default before torch 2.0, and is still what loops written for
speed with ``foreach`` optimizers or for CUDA graphs pass; with it, the cleared gradients are
zero tensors rather than None, so they look like gradients that are merely zero. The fix:
``zero_grad()`` before ``backward()``.

Source: issue 25 ("Weights that never change, while gradients are non-zero and cleared before the
step, are reported as plateau (the symptom), not no_update (the cause)"); the pattern of
"optimizer.zero_grad() placed after loss.backward()",
https://discuss.pytorch.org/t/why-do-we-need-to-set-the-gradients-manually-to-zero-in-pytorch/4903 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://discuss.pytorch.org/t/why-do-we-need-to-set-the-gradients-manually-to-zero-in-pytorch/4903"
CLASS = "gradients zeroed between backward and step"
KIND, MODULE, CAUSE, ONSET = "no_update", "", None, 0


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(40):
            x = torch.randn(32, 10, generator=g)
            y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
            if not bug:
                opt.zero_grad(set_to_none=False)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            if bug:
                opt.zero_grad(set_to_none=False)  # the bug: clears the gradients just computed
            opt.step()
            watch(s)
        return s.report()
