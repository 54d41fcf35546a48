"""A VQ-VAE's residual stack is built with ``nn.ModuleList([Residual(...)] * num_layers)``: list
multiplication repeats one instance, so every "layer" is the same module registered under several
names, the weights are shared, and the stack has 1/num_layers of the parameters it appears to
have. Nothing fails. The fix: a list comprehension that builds a new block per layer.

Source: zalandoresearch/pytorch-vq-vae#2 "Intentional weight sharing in ResidualStack?"
(maintainer: "I think its a bug... I will fix it!"), https://github.com/zalandoresearch/pytorch-vq-vae/issues/2 ;
deep-learning-with-pytorch/dlwpt-code#89 ("ResBlock" objects are most likely identical,
``n_blocks * [ResBlock(...)]``, confirmed), https://github.com/deep-learning-with-pytorch/dlwpt-code/issues/89 ;
yaoppeng/U-Net_v2#10, https://github.com/yaoppeng/U-Net_v2/issues/10 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = ("https://github.com/zalandoresearch/pytorch-vq-vae/issues/2; "
          "https://github.com/deep-learning-with-pytorch/dlwpt-code/issues/89; https://github.com/yaoppeng/U-Net_v2/issues/10")
CLASS = "one module instance registered under several names"
KIND, MODULE, CAUSE, ONSET = "shared_module", "stack._layers.0", None, 0


class Residual(nn.Module):
    def __init__(self, channels: int, hidden: int) -> None:
        super().__init__()
        self._block = nn.Sequential(nn.ReLU(), nn.Conv2d(channels, hidden, 3, padding=1, bias=False),
                                    nn.ReLU(), nn.Conv2d(hidden, channels, 1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self._block(x)


class ResidualStack(nn.Module):
    def __init__(self, channels: int, hidden: int, num_layers: int, bug: bool) -> None:
        super().__init__()
        if bug:
            self._layers = nn.ModuleList([Residual(channels, hidden)] * num_layers)  # the bug
        else:
            self._layers = nn.ModuleList([Residual(channels, hidden) for _ in range(num_layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self._layers:
            x = layer(x)
        return nn.functional.relu(x)


class AutoEncoder(nn.Module):
    def __init__(self, bug: bool) -> None:
        super().__init__()
        self.enc = nn.Conv2d(1, 16, 4, stride=2, padding=1)
        self.stack = ResidualStack(16, 8, 3, bug)
        self.dec = nn.ConvTranspose2d(16, 1, 4, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dec(self.stack(self.enc(x)))


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = AutoEncoder(bug)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(30):
            x = torch.rand(8, 1, 16, 16, generator=g).round()
            opt.zero_grad()
            nn.functional.mse_loss(model(x), x).backward()
            opt.step()
            watch(s)
        return s.report()
