"""A neural bag-of-words sentiment classifier whose embedding has a ``padding_idx``.

Modelled on: bentrevett/pytorch-sentiment-analysis, "1 - Neural Bag of Words"
(https://github.com/bentrevett/pytorch-sentiment-analysis/blob/main/1%20-%20Neural%20Bag%20of%20Words.ipynb):
``nn.Embedding(vocab_size, embedding_dim, padding_idx=pad_index)``, ``embedded.mean(dim=1)``
over the padded sequence, ``nn.Linear`` to the classes, Adam, ``CrossEntropyLoss``; batches are
padded to their longest review with ``pad_sequence(padding_value=pad_index)``. Reviews: 4-30
tokens, mostly neutral words, with sentiment words whose balance decides the label.

Why it is healthy: ``padding_idx`` makes the padding row's gradient exactly zero by design (it
stays at its initial zeros), so that one row of the embedding never learns; every other row
does, and the loss falls.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

MODELLED_ON = "https://github.com/bentrevett/pytorch-sentiment-analysis/blob/main/1%20-%20Neural%20Bag%20of%20Words.ipynb"
VOCAB, PAD, EMB, BATCH = 500, 0, 32, 32


class NBoW(nn.Module):
    def __init__(self, vocab_size: int, embedding_dim: int, output_dim: int, pad_index: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=pad_index)
        self.fc = nn.Linear(embedding_dim, output_dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(self.embedding(ids).mean(dim=1))


def reviews(g: torch.Generator, sentiment: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.randint(0, 2, (BATCH,), generator=g)
    seqs = []
    for label in labels:
        n = int(torch.randint(4, 31, (1,), generator=g))
        ids = torch.randint(1, VOCAB, (n,), generator=g)
        polar = torch.rand(n, generator=g) < 0.3
        side = torch.where(torch.rand(n, generator=g) < 0.8, label, 1 - label)
        picks = sentiment[side, torch.randint(0, sentiment.shape[1], (n,), generator=g)]
        seqs.append(torch.where(polar, picks, ids))
    return nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=PAD), labels


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(1234)
    g = torch.Generator().manual_seed(1234)
    sentiment = torch.randperm(VOCAB - 1, generator=g)[:60].view(2, 30) + 1  # negative row, positive row
    model = NBoW(VOCAB, EMB, 2, PAD)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    criterion = nn.CrossEntropyLoss()
    sentinel = torch_sentinel.attach(model, optimizer, log_dir=log_dir)
    model.train()
    for _ in range(steps):
        ids, label = reviews(g, sentiment)
        prediction = model(ids)
        loss = criterion(prediction, label)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if progress is not None:
            progress.append(loss.item())
    report = sentinel.report()
    sentinel.detach()
    return report
