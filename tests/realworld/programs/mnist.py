"""A small convnet classifier in the style of the PyTorch MNIST example.

Modelled on: pytorch/examples ``mnist/main.py`` (two conv layers, max-pool, dropout, a
``log_softmax`` head with ``F.nll_loss``, ``optim.Adadelta(lr=1.0)`` and ``StepLR(gamma=0.7)``
stepped once per epoch, ``model.train()`` at the start of each epoch and a ``test()`` pass in
``model.eval()`` under ``no_grad``).

Data: 12x12 single-channel "digits": the class picks which quadrant holds a bright blob.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from realworld.harness import Bug
from torch import nn
from torch.optim.lr_scheduler import StepLR

import torch_sentinel

MODELLED_ON = "pytorch/examples mnist/main.py"
HEALTHY_XFAIL: Optional[str] = None
BUGS = {
    "softmax_into_nll": Bug("F.softmax instead of F.log_softmax before F.nll_loss",
                            "probabilities_as_logits", module=""),
    "no_zero_grad": Bug("optimizer.zero_grad() deleted from the batch loop", "missing_zero_grad"),
    "eval_left_on": Bug("model.eval() (from test()) never undone by model.train()",
                        "eval_mode_training", module="", onset=20),
}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(16 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor, probs: bool = False) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = self.dropout1(torch.flatten(x, 1))
        x = self.dropout2(F.relu(self.fc1(x)))
        x = self.fc2(x)
        return F.softmax(x, dim=1) if probs else F.log_softmax(x, dim=1)


def make_data(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.randint(0, 4, (n,), generator=g)
    x = 0.3 * torch.randn(n, 1, 12, 12, generator=g)
    for i, c in enumerate(y.tolist()):
        r, q = divmod(c, 2)
        x[i, 0, r * 6 + 1:r * 6 + 5, q * 6 + 1:q * 6 + 5] += 1.5
    return x, y


def run(bug: Optional[str] = None, log_dir: Optional[str] = None) -> list[float]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x_train, y_train = make_data(640, g)
    x_test, y_test = make_data(128, g)
    model = Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    losses: list[float] = []
    with torch_sentinel.attach(model, optimizer, log_dir=log_dir):
        for _epoch in range(3):
            if bug != "eval_left_on" or _epoch == 0:
                model.train()
            for i in range(0, len(x_train), 32):
                data, target = x_train[i:i + 32], y_train[i:i + 32]
                if bug != "no_zero_grad":
                    optimizer.zero_grad()
                output = model(data, probs=bug == "softmax_into_nll")
                loss = F.nll_loss(output, target)
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
            model.eval()  # test(): the eval pass every epoch
            with torch.no_grad():
                F.nll_loss(model(x_test), y_test, reduction="sum")
            scheduler.step()
    return losses
