"""A classifier ends in ``nn.Softmax`` and is trained with ``nn.CrossEntropyLoss``, which applies
log-softmax itself: the probabilities are squashed a second time, the gradients shrink and the
loss stalls well above what the same network reaches on logits.

Source: "Logits vs probabilities in nn.CrossEntropyLoss" (a softmax layer before
CrossEntropyLoss is applied twice), https://openillumi.com/en/en-pytorch-crossentropy-logits-nllloss-mechanism ;
UMLAUT (Schoop et al., CHI 2021), heuristic "softmax before the loss".
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://openillumi.com/en/en-pytorch-crossentropy-logits-nllloss-mechanism; UMLAUT (CHI 2021)"
CLASS = "probabilities fed to a loss that expects logits"
KIND, MODULE, CAUSE, ONSET = "probabilities_as_logits", "3", None, 0


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 5)]
    if bug:
        layers.append(nn.Softmax(dim=1))  # the bug
    model = nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    criterion = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1)
    x_all = torch.randn(512, 16, generator=g)
    y_all = x_all[:, :5].argmax(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(40):
            idx = torch.randint(0, 512, (32,), generator=g)
            opt.zero_grad()
            criterion(model(x_all[idx]), y_all[idx]).backward()
            opt.step()
            watch(s)
        return s.report()
