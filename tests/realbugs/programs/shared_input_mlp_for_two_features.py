"""A DDSP decoder encodes pitch and loudness with ``self.in_mlps = nn.ModuleList([mlp(1, hidden,
3)] * 2)``: list multiplication makes ``in_mlps[0] is in_mlps[1]``, so the pitch and loudness
encoders are one module under two names and share their weights, although the two features mean
different things. Nothing fails. The fix: build one MLP per feature.

Source: acids-ircam/ddsp_pytorch#37 "Do MLPs share weight by accident?" (torchinfo labels the
second as recursive), https://github.com/acids-ircam/ddsp_pytorch/issues/37 ; linkedin/Liger-Kernel#269
"Fix sharing a ResBlock layer for each head in Medusa example" (the same list multiplication,
fixed), https://github.com/linkedin/Liger-Kernel/pull/269 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/acids-ircam/ddsp_pytorch/issues/37; https://github.com/linkedin/Liger-Kernel/pull/269"
CLASS = "one module instance registered under several names"
KIND, MODULE, CAUSE, ONSET = "shared_module", "in_mlps.0", None, 0


def mlp(in_size: int, hidden: int, n_layers: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(n_layers):
        layers += [nn.Linear(in_size if i == 0 else hidden, hidden), nn.LayerNorm(hidden), nn.LeakyReLU()]
    return nn.Sequential(*layers)


class Decoder(nn.Module):
    def __init__(self, bug: bool, hidden: int = 16) -> None:
        super().__init__()
        if bug:
            self.in_mlps = nn.ModuleList([mlp(1, hidden, 2)] * 2)  # the bug
        else:
            self.in_mlps = nn.ModuleList([mlp(1, hidden, 2) for _ in range(2)])
        self.gru = nn.GRU(2 * hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, 8)

    def forward(self, pitch: torch.Tensor, loudness: torch.Tensor) -> torch.Tensor:
        h = torch.cat([self.in_mlps[0](pitch), self.in_mlps[1](loudness)], -1)
        return self.out(self.gru(h)[0])


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = Decoder(bug)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(30):
            pitch = torch.rand(8, 20, 1, generator=g)
            loudness = torch.rand(8, 20, 1, generator=g) - 0.5
            k = torch.arange(8).float()
            target = torch.sin(pitch * (k + 1)) * loudness.abs()  # harmonic amplitudes
            opt.zero_grad()
            nn.functional.mse_loss(model(pitch, loudness), target).backward()
            opt.step()
            watch(s)
        return s.report()
