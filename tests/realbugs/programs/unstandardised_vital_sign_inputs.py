"""A two-layer sigmoid network that classified well on a toy dataset is moved to clinical data
(age, resting blood pressure, cholesterol, maximum heart rate: values in the tens and hundreds):
the hidden sigmoids saturate, gradients vanish and the loss stagnates. The fix: standardise the
inputs (z-score), which lets the same network learn.

Source: "PyTorch Performance Drop? Missing Standardization is the 1-Line Solution" (a two-layer
sigmoid model that stops learning on heart-rate data; ``x_data = (x_data - x_data.mean()) /
x_data.std()``), https://openillumi.com/en/en-pytorch-performance-fix-standardization ; UMLAUT
(Schoop et al., CHI 2021) heuristic "inputs outside [-1, 1]".
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://openillumi.com/en/en-pytorch-performance-fix-standardization; UMLAUT (CHI 2021)"
CLASS = "inputs not normalised"
KIND, MODULE, CAUSE, ONSET = "unnormalized_input", None, None, 0


class Model(nn.Module):
    def __init__(self, input_size: int, h1: int, output_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(input_size, h1)
        self.linear2 = nn.Linear(h1, output_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.linear2(torch.sigmoid(self.linear(x))))


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    n = 600
    mean = torch.tensor([54.0, 131.0, 246.0, 150.0])
    std = torch.tensor([9.0, 17.0, 52.0, 23.0])
    x_data = mean + std * torch.randn(n, 4, generator=g)
    risk = (x_data[:, 0] - 54) / 9 - (x_data[:, 3] - 150) / 23 + 0.5 * (x_data[:, 2] - 246) / 52
    y_data = (risk > 0).float().unsqueeze(1)
    if not bug:
        x_data = (x_data - x_data.mean(0)) / x_data.std(0)  # the fix
    model = Model(4, 8, 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(50):
            idx = torch.randint(0, n, (64,), generator=g)
            opt.zero_grad()
            nn.functional.binary_cross_entropy(model(x_data[idx]), y_data[idx]).backward()
            opt.step()
            watch(s)
        return s.report()
