"""A residual MLP whose blocks run under activation checkpointing.

Modelled on: the ``torch.utils.checkpoint`` pattern of huggingface/transformers'
``gradient_checkpointing_enable()`` (each layer called as ``self._gradient_checkpointing_func(
layer.__call__, hidden_states, ...)``, i.e. ``checkpoint(layer, x, use_reentrant=...)``) and of
pytorch/examples ``distributed/FSDP/policies/activation_checkpointing_functions.py``; trained
with AdamW and ``clip_grad_norm_``. The reentrant variant is the old default whose parameters
get no gradient when no input requires grad (torch warns "None of the inputs have
requires_grad=True").

Data: 16-D regression: y = tanh(x @ w) summed over 4 projections.
"""

from __future__ import annotations

from typing import Optional

import torch
from realworld.harness import Bug
from torch import nn
from torch.utils.checkpoint import checkpoint

import torch_sentinel

MODELLED_ON = ("huggingface/transformers gradient_checkpointing_enable (torch.utils.checkpoint); "
               "pytorch/examples distributed/FSDP activation checkpointing")
HEALTHY_XFAIL: Optional[str] = None
BUGS = {
    "reentrant_first_block": Bug("checkpoint(block, x, use_reentrant=True): the raw input needs "
                                 "no grad, so no block gets one",
                                 "no_gradient", module="blocks"),
    "tanh_big_init": Bug("nn.init.normal_(block.fc1.weight, std=3.0) in the init loop",
                         "saturation", module="blocks.0.act"),
}


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.act = nn.Tanh()
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self, d: int = 16, depth: int = 3, reentrant: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(depth))
        self.head = nn.Linear(d, 1)
        self.reentrant = reentrant
        self.gradient_checkpointing = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.gradient_checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=self.reentrant)
            else:
                x = block(x)
        return self.head(x).squeeze(-1)


def run(bug: Optional[str] = None, log_dir: Optional[str] = None) -> list[float]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    w = torch.randn(16, 4, generator=g) / 2
    model = Net(reentrant=bug == "reentrant_first_block")
    if bug == "tanh_big_init":
        for block in model.blocks:
            nn.init.normal_(block.fc1.weight, std=3.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses: list[float] = []
    with torch_sentinel.attach(model, optimizer, log_dir=log_dir):
        model.train()
        for _step in range(40):
            x = torch.randn(64, 16, generator=g)
            y = torch.tanh(x @ w).sum(-1)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
    return losses
