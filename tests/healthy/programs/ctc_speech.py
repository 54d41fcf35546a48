"""A small acoustic model trained with CTC on variable-length "utterances" and transcripts.

Modelled on: SeanNaren/deepspeech.pytorch (https://github.com/SeanNaren/deepspeech.pytorch,
``deepspeech_pytorch/model.py`` and its training step: a convolution, then a bidirectional GRU
over the packed feature frames (``pack_padded_sequence``), a linear layer to the alphabet with
the blank at index 0, ``log_softmax``, the output transposed to (T, N, C) for
``nn.CTCLoss(blank=0, reduction="mean", zero_infinity=True)`` with per-utterance input and
target lengths, gradient-norm clipping at 400) and the usage in the
``torch.nn.CTCLoss`` docs. Each synthetic utterance spells 2-4 symbols out of 8; every symbol
lasts 2-4 frames of its own 12-dim feature pattern plus noise, with silence between words;
batches are padded to their longest utterance.

Why it is healthy: the CTC loss starts high (the blank-dominated alignment is learned first,
often with a short plateau) and falls as the symbols are recognised.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

MODELLED_ON = "https://github.com/SeanNaren/deepspeech.pytorch/blob/master/deepspeech_pytorch/model.py"
SYMBOLS, FEATS, BATCH = 8, 12, 8


class AcousticModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(FEATS, 32, 3, padding=1), nn.BatchNorm1d(32), nn.Hardtanh(0, 20))
        self.rnn = nn.GRU(32, 32, num_layers=1, bidirectional=True, batch_first=True)
        self.fc = nn.Linear(64, SYMBOLS + 1)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:  # x: (N, T, F)
        x = self.conv(x.transpose(1, 2)).transpose(1, 2)
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        x, _ = nn.utils.rnn.pad_packed_sequence(self.rnn(packed)[0], batch_first=True)
        return self.fc(x).log_softmax(-1)


def utterances(patterns: torch.Tensor, g: torch.Generator):
    feats, targets, in_lens, tgt_lens = [], [], [], []
    for _ in range(BATCH):
        n = int(torch.randint(2, 5, (1,), generator=g))
        symbols = torch.randint(1, SYMBOLS + 1, (n,), generator=g)
        frames = [torch.zeros(int(torch.randint(1, 4, (1,), generator=g)), FEATS)]
        for s in symbols:
            frames.append(patterns[s].repeat(int(torch.randint(2, 5, (1,), generator=g)), 1))
            frames.append(torch.zeros(int(torch.randint(0, 3, (1,), generator=g)), FEATS))
        x = torch.cat(frames)
        feats.append(x + 0.3 * torch.randn(x.shape, generator=g))
        targets.append(symbols)
        in_lens.append(len(x))
        tgt_lens.append(n)
    padded = nn.utils.rnn.pad_sequence(feats, batch_first=True)
    return padded, torch.cat(targets), torch.tensor(in_lens), torch.tensor(tgt_lens)


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    patterns = torch.randn(SYMBOLS + 1, FEATS, generator=g)
    model = AcousticModel()
    criterion = nn.CTCLoss(blank=0, reduction="mean", zero_infinity=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sentinel = torch_sentinel.attach(model, optimizer, log_dir=log_dir)
    for _ in range(steps):
        inputs, targets, input_sizes, target_sizes = utterances(patterns, g)
        out = model(inputs, input_sizes).transpose(0, 1)  # (T, N, C)
        loss = criterion(out, targets, input_sizes, target_sizes)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 400)
        optimizer.step()
        if progress is not None:
            progress.append(loss.item())
    report = sentinel.report()
    sentinel.detach()
    return report
