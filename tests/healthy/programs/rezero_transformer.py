"""A ReZero transformer: every residual branch is scaled by a learnable scalar initialised to exactly 0.

Modelled on: majumderb/rezero (https://github.com/majumderb/rezero, ``rezero/transformer/rezero_transformer.py``
``RZTXEncoderLayer``: ``self.resweight = nn.Parameter(torch.Tensor([0]))``, ``src = src +
self.dropout1(src2) * self.resweight`` for attention and again for the feed-forward branch, no
LayerNorm), trained with Adam as in their character-level language-modelling notebook. Task: a
character-level LM on a synthetic text where each word is drawn from a small vocabulary and
spelled out, so the next character is predictable within a word.

Why it is healthy: at initialisation every block is the identity; at the first step only the
``resweight`` scalars get a gradient (the branch weights are multiplied by 0), so their first
Adam update is a relative change of infinity from exactly 0, and the branch weights start moving
from the second step on. This is the method; the loss falls fast.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

import torch_sentinel

MODELLED_ON = "https://github.com/majumderb/rezero/blob/master/rezero/transformer/rezero_transformer.py"
D_MODEL, NHEAD, FF, LAYERS, CONTEXT, BATCH = 32, 4, 64, 2, 16, 16
WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "to", "its", "bed", "and", "slept"]
CHARS = sorted(set("".join(WORDS) + " "))


class RZTXEncoderLayer(nn.Module):
    def __init__(self, d_model: int, nhead: int, dim_feedforward: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=True)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.resweight = nn.Parameter(torch.Tensor([0]))
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, src: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        src2 = self.self_attn(src, src, src, attn_mask=mask, need_weights=False)[0]
        src = src + self.dropout1(src2) * self.resweight
        src2 = self.linear2(self.dropout(F.relu(self.linear1(src))))
        return src + self.dropout2(src2) * self.resweight


class CharLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(len(CHARS), D_MODEL)
        self.pos = nn.Embedding(CONTEXT, D_MODEL)
        self.layers = nn.ModuleList([RZTXEncoderLayer(D_MODEL, NHEAD, FF) for _ in range(LAYERS)])
        self.out = nn.Linear(D_MODEL, len(CHARS))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        x = self.embed(idx) + self.pos(torch.arange(t))
        for layer in self.layers:
            x = layer(x, mask)
        return self.out(x)


def corpus(g: torch.Generator, n_words: int = 4000) -> torch.Tensor:
    picks = torch.randint(0, len(WORDS), (n_words,), generator=g)
    text = " ".join(WORDS[int(i)] for i in picks)
    return torch.tensor([CHARS.index(c) for c in text])


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = corpus(g)
    model = CharLM()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    sentinel = torch_sentinel.attach(model, optimizer, log_dir=log_dir)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(data) - CONTEXT - 1, (BATCH,), generator=g)
        x = torch.stack([data[s:s + CONTEXT] for s in starts])
        y = torch.stack([data[s + 1:s + CONTEXT + 1] for s in starts])
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, len(CHARS)), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if progress is not None:
            progress.append(loss.item())
    report = sentinel.report()
    sentinel.detach()
    return report
