"""Robust regression with the Huber loss on data whose batches hold a varying number of gross outliers.

Modelled on: scikit-learn's example "HuberRegressor vs Ridge on dataset with strong outliers"
(https://scikit-learn.org/stable/auto_examples/linear_model/plot_huber_vs_ridge.html), written as
a PyTorch model trained with ``nn.HuberLoss(delta=1.0)`` and Adam, the usual robust-loss
recipe for sensor data: a small MLP, 10 features, 8% of the samples corrupted by +-40.

Why it is healthy: the Huber loss of an outlier grows only linearly, so the fit follows the
inliers. The per-batch loss is dominated by how many outliers the batch happens to hold (0 to
8 of 32, binomially), so it jumps by several times from one batch to the next for ever; the
error on clean held-out data falls throughout.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

MODELLED_ON = "https://scikit-learn.org/stable/auto_examples/linear_model/plot_huber_vs_ridge.html"
BATCH, FEATURES, OUTLIER_RATE = 32, 10, 0.08


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(FEATURES, generator=g)

    def clean(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, FEATURES, generator=g)
        return x, x @ w + 0.5 * torch.tanh(x[:, 0] * x[:, 1]) + 0.1 * torch.randn(n, generator=g)

    x_val, y_val = clean(512)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    criterion = nn.HuberLoss(delta=1.0)
    sentinel = torch_sentinel.attach(model, optimizer, log_dir=log_dir)
    for step in range(steps):
        x, y = clean(BATCH)
        outliers = torch.rand(BATCH, generator=g) < OUTLIER_RATE
        y = torch.where(outliers, y + 40 * torch.sign(torch.randn(BATCH, generator=g)), y)
        optimizer.zero_grad()
        loss = criterion(model(x).squeeze(1), y)
        loss.backward()
        optimizer.step()
        if step % 10 == 9:  # the clean held-out error, as the example plots it
            model.eval()
            with torch.no_grad():
                val_mse = nn.functional.mse_loss(model(x_val).squeeze(1), y_val).item()
            model.train()
            if progress is not None:
                progress.append(val_mse)
    report = sentinel.report()
    sentinel.detach()
    return report
