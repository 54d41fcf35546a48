"""The one-line attach on a plain training loop: a healthy run, then a NaN caught where it starts.

    python examples/quickstart.py
"""

from __future__ import annotations

import math
import tempfile

import torch
from torch import nn

import torch_sentinel


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    log_dir = tempfile.mkdtemp(prefix="sentinel_quickstart_")

    teacher = torch.randn(20, 4)  # a learnable task: labels come from a fixed projection

    sentinel = torch_sentinel.attach(model, optimizer, log_dir=log_dir)  # the one line
    try:
        for step in range(60):
            x = torch.randn(32, 20)
            y = (x @ teacher).argmax(dim=1)
            if step == 42:
                x[5, 7] = math.nan  # a corrupt sample slips into the batch
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
    except torch_sentinel.NonFiniteError as err:
        print(err)
        print()
    finally:
        sentinel.detach()
    print(sentinel.report())
    print(f"\nTensorBoard: tensorboard --logdir {log_dir}")


if __name__ == "__main__":
    main()
