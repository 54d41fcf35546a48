"""Gradual unfreezing: a pretrained backbone's blocks join the optimizer one by one via ``add_param_group``.

Modelled on: Lightning's ``BackboneFinetuning`` / ``BaseFinetuning.unfreeze_and_add_param_group``
(https://github.com/Lightning-AI/pytorch-lightning/blob/master/src/lightning/pytorch/callbacks/finetuning.py:
the backbone starts frozen with only the head in the optimizer; at the unfreeze epoch the
backbone's parameters get ``requires_grad=True`` and are added with
``optimizer.add_param_group({"params": ..., "lr": lr * ratio})``), applied block by block from the
top as ULMFiT's gradual unfreezing does, with ULMFiT's discriminative rates (lr / 2.6 per block
further down; Howard & Ruder 2018, https://arxiv.org/abs/1801.06146). The backbone is pretrained
in the program on a related task (a 6-way classification of the same inputs) before fine-tuning
on the 3-way target task.

Why it is healthy: every parameter that receives a gradient is in the optimizer from the step
its block is unfrozen (steps 60, 120, 180); before that it has ``requires_grad=False`` and gets
no gradient. The pretrained features already fit the target task well: the head alone brings
the loss from ~1 to ~0.08 by step 90, and the unfrozen blocks keep it near that level.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

MODELLED_ON = "https://github.com/Lightning-AI/pytorch-lightning/blob/master/src/lightning/pytorch/callbacks/finetuning.py"
FEATURES, BATCH, LR, UNFREEZE_EVERY = 24, 32, 3e-3, 60


def make_backbone() -> nn.Sequential:
    return nn.Sequential(
        nn.Sequential(nn.Linear(FEATURES, 64), nn.LayerNorm(64), nn.GELU()),
        nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU()),
        nn.Sequential(nn.Linear(64, 32), nn.LayerNorm(32), nn.GELU()),
    )


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    mixing = torch.randn(FEATURES, FEATURES, generator=g) / FEATURES**0.5
    proto = torch.randn(6, FEATURES, generator=g)

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        fine = torch.randint(0, 6, (n,), generator=g)
        x = torch.tanh((proto[fine] + 0.9 * torch.randn(n, FEATURES, generator=g)) @ mixing) * 2
        return x, fine

    backbone = make_backbone()
    pretrain_head = nn.Linear(32, 6)
    pre_opt = torch.optim.AdamW([*backbone.parameters(), *pretrain_head.parameters()], lr=1e-3)
    for _ in range(150):  # "pretrained" backbone
        x, fine = batch(BATCH)
        pre_opt.zero_grad()
        nn.functional.cross_entropy(pretrain_head(backbone(x)), fine).backward()
        pre_opt.step()

    model = nn.Sequential(backbone, nn.Linear(32, 3))
    for p in backbone.parameters():
        p.requires_grad = False
    optimizer = torch.optim.AdamW(model[1].parameters(), lr=LR)
    sentinel = torch_sentinel.attach(model, optimizer, log_dir=log_dir)
    frozen = list(reversed(range(len(backbone))))  # top block first
    for step in range(steps):
        if step > 0 and step % UNFREEZE_EVERY == 0 and frozen:
            block = frozen.pop(0)
            params = list(backbone[block].parameters())
            for p in params:
                p.requires_grad = True
            optimizer.add_param_group({"params": params, "lr": LR / 2.6 ** (len(backbone) - block)})
        x, fine = batch(BATCH)
        coarse = fine % 3  # the target task: merged classes {0,3}, {1,4}, {2,5}
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), coarse)
        loss.backward()
        optimizer.step()
        if progress is not None:
            progress.append(loss.item())
    report = sentinel.report()
    sentinel.detach()
    return report
