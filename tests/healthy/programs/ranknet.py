"""Pairwise learning to rank (RankNet): one network scores two documents and the loss sees only the difference.

Modelled on: haowei01/pytorch-examples ``ranking/RankNet.py``
(https://github.com/haowei01/pytorch-examples/blob/master/ranking/RankNet.py): ``RankNet.forward(input1,
input2)`` runs the same fully connected layers (ReLU between them) on both documents and
returns ``torch.sigmoid(input1 - input2)`` of the two final scores; ``nn.BCELoss`` against "the
first is more relevant"; Adam with ``StepLR(step_size=10, gamma=0.5)`` per epoch; net structure
[136, 64, 16] with 136 LETOR features (here 20 features, [20, 64, 16]). Relevance grades 0-4
come from a hidden function of the features; pairs are drawn within queries with different
grades.

Why it is healthy: ``fc3(x1) - fc3(x2)`` cancels the last layer's bias exactly, so the gradient of
``fc3.bias`` is 0 on every step, by construction (the score is defined up to a constant); every
other parameter learns and the pairwise loss falls.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

import torch_sentinel

MODELLED_ON = "https://github.com/haowei01/pytorch-examples/blob/master/ranking/RankNet.py"
FEATURES, PAIRS, STEPS_PER_EPOCH = 20, 64, 30


class RankNet(nn.Module):
    def __init__(self, net_structures: list[int]) -> None:
        super().__init__()
        self.fc_layers = len(net_structures)
        for i in range(len(net_structures) - 1):
            setattr(self, "fc" + str(i + 1), nn.Linear(net_structures[i], net_structures[i + 1]))
        setattr(self, "fc" + str(len(net_structures)), nn.Linear(net_structures[-1], 1))

    def forward(self, input1: torch.Tensor, input2: torch.Tensor) -> torch.Tensor:
        for i in range(1, self.fc_layers):
            fc = getattr(self, "fc" + str(i))
            input1 = F.relu(fc(input1))
            input2 = F.relu(fc(input2))
        fc = getattr(self, "fc" + str(self.fc_layers))
        return torch.sigmoid(fc(input1) - fc(input2))


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(FEATURES, generator=g)

    def grade(x: torch.Tensor) -> torch.Tensor:
        return torch.bucketize(x @ w / FEATURES**0.5 + 0.3 * torch.tanh(x[:, 0] * x[:, 1]),
                               torch.tensor([-1.0, -0.3, 0.3, 1.0]))

    net = RankNet([FEATURES, 64, 16])
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    loss_func = nn.BCELoss()
    sentinel = torch_sentinel.attach(net, optimizer, log_dir=log_dir)
    net.train()
    for step in range(steps):
        x_i = torch.randn(PAIRS * 2, FEATURES, generator=g)
        x_j = torch.randn(PAIRS * 2, FEATURES, generator=g)
        y_i, y_j = grade(x_i), grade(x_j)
        keep = (y_i != y_j).nonzero().squeeze(1)[:PAIRS]
        x_i, x_j, y = x_i[keep], x_j[keep], (y_i[keep] > y_j[keep]).float()
        net.zero_grad()
        y_pred = net(x_i, x_j)
        loss = loss_func(y_pred.squeeze(1), y)
        loss.backward()
        optimizer.step()
        if step % STEPS_PER_EPOCH == STEPS_PER_EPOCH - 1:
            scheduler.step()
        if progress is not None:
            progress.append(loss.item())
    report = sentinel.report()
    sentinel.detach()
    return report
