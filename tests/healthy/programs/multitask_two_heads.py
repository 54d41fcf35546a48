"""Multi-task learning: a shared trunk, a classification head and a regression head, a weighted sum of losses.

Modelled on: SimonVandenhende/Multi-Task-Learning-PyTorch
(https://github.com/SimonVandenhende/Multi-Task-Learning-PyTorch, ``models/models.py``
``MultiTaskModel``: a shared backbone and a ``nn.ModuleDict`` of task heads; ``losses/loss_schemes.py``
``MultiTaskLoss``: ``sum(loss_weights[t] * losses[t])``), with fixed task weights (1.0 for the
class, 0.5 for the regression target) and SGD with momentum and a step decay, as their
config files set. Synthetic tabular data: 20 features, a 4-way label and a real target, both
functions of a shared 8-dim latent.

Why it is healthy: both heads train on every batch through the shared trunk, whose gradient is
the weighted sum of the two tasks' gradients; the weighted loss falls, with a further drop at
the lr decay (step 200).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

MODELLED_ON = "https://github.com/SimonVandenhende/Multi-Task-Learning-PyTorch"
FEATURES, LATENT, CLASSES, BATCH = 20, 8, 4, 64
LOSS_WEIGHTS = {"class": 1.0, "value": 0.5}


class MultiTaskModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.heads = nn.ModuleDict({"class": nn.Linear(64, CLASSES),
                                    "value": nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))})

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        shared = self.backbone(x)
        return {task: head(shared) for task, head in self.heads.items()}


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    encode = torch.randn(LATENT, FEATURES, generator=g) / LATENT**0.5
    to_class = torch.randn(LATENT, CLASSES, generator=g)
    to_value = torch.randn(LATENT, generator=g)
    model = MultiTaskModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[200], gamma=0.1)
    losses = {"class": nn.CrossEntropyLoss(), "value": nn.MSELoss()}
    sentinel = torch_sentinel.attach(model, optimizer, log_dir=log_dir)
    for _ in range(steps):
        z = torch.randn(BATCH, LATENT, generator=g)
        x = z @ encode + 0.1 * torch.randn(BATCH, FEATURES, generator=g)
        targets = {"class": (z @ to_class).argmax(1), "value": (torch.sin(z) @ to_value).unsqueeze(1)}
        outputs = model(x)
        loss = sum(LOSS_WEIGHTS[t] * losses[t](outputs[t], targets[t]) for t in LOSS_WEIGHTS)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        if progress is not None:
            progress.append(loss.item())
    report = sentinel.report()
    sentinel.detach()
    return report
