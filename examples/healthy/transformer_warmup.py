"""Healthy: a small transformer classifier whose learning rate warms up linearly from 0.

The first step has lr 0 and moves nothing; that single still step is healthy.
Expected: no fault findings (``report.ok``).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

EXPECTED = None


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 20, d: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(1))


def run(steps: int = 50, log_dir: Optional[str] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = TinyTransformer()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    warmup = 10
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / warmup))
    with torch_sentinel.attach(model, opt, log_dir=log_dir, flush_every=25) as sentinel:
        for _ in range(steps):
            tokens = torch.randint(0, 20, (32, 10))
            y = tokens[:, 0] % 4  # the class is readable from the first token
            opt.zero_grad()
            nn.functional.cross_entropy(model(tokens), y).backward()
            opt.step()
            sched.step()
        return sentinel.report()


if __name__ == "__main__":
    print(run())
