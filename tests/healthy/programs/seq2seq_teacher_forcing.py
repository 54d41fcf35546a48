"""An LSTM encoder-decoder trained with random teacher forcing on a toy "translation" (sequence reversal).

Modelled on: bentrevett/pytorch-seq2seq, "1 - Sequence to Sequence Learning with Neural Networks"
(https://github.com/bentrevett/pytorch-seq2seq/blob/main/1%20-%20Sequence%20to%20Sequence%20Learning%20with%20Neural%20Networks.ipynb):
``Encoder`` (embedding, dropout, 2-layer LSTM), ``Decoder`` (embedding, LSTM, ``fc_out``), a
``Seq2Seq`` module that feeds the decoder one token at a time and uses the ground-truth token as
the next input with probability ``teacher_forcing_ratio = 0.5``, weights initialised uniformly
in +-0.08, Adam, ``CrossEntropyLoss(ignore_index=pad)`` over ``output[1:]``,
``clip_grad_norm_(clip=1)``. Source: 2-4 random tokens out of 5; target: the same tokens reversed,
between <sos> and <eos>, padded.

Why it is healthy: with teacher forcing drawn at random per time step, some batches decode
mostly from the model's own guesses and score worse, so the loss is noisy. It first learns
where <eos> goes and the token statistics, then sits near that level for ~100 steps (the
encoder has not yet learnt to carry the source through its state, the usual stall of a plain
encoder-decoder), then falls again as the reversal is learnt.
"""

from __future__ import annotations

import random
from typing import Optional

import torch
from torch import nn

import torch_sentinel

MODELLED_ON = "https://github.com/bentrevett/pytorch-seq2seq"
VOCAB, PAD, SOS, EOS, EMB, HID, BATCH = 8, 0, 1, 2, 16, 64, 32


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, EMB)
        self.rnn = nn.LSTM(EMB, HID, 2, dropout=0.1)
        self.dropout = nn.Dropout(0.1)

    def forward(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, (hidden, cell) = self.rnn(self.dropout(self.embedding(src)))
        return hidden, cell


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, EMB)
        self.rnn = nn.LSTM(EMB, HID, 2, dropout=0.1)
        self.fc_out = nn.Linear(HID, VOCAB)
        self.dropout = nn.Dropout(0.1)

    def forward(self, token: torch.Tensor, hidden: torch.Tensor, cell: torch.Tensor):
        output, (hidden, cell) = self.rnn(self.dropout(self.embedding(token.unsqueeze(0))), (hidden, cell))
        return self.fc_out(output.squeeze(0)), hidden, cell


class Seq2Seq(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder, self.decoder = Encoder(), Decoder()

    def forward(self, src: torch.Tensor, trg: torch.Tensor, teacher_forcing_ratio: float = 0.5) -> torch.Tensor:
        trg_len, batch_size = trg.shape
        outputs = torch.zeros(trg_len, batch_size, VOCAB)
        hidden, cell = self.encoder(src)
        token = trg[0, :]
        for t in range(1, trg_len):
            output, hidden, cell = self.decoder(token, hidden, cell)
            outputs[t] = output
            teacher_force = random.random() < teacher_forcing_ratio
            token = trg[t] if teacher_force else output.argmax(1)
        return outputs


def init_weights(m: nn.Module) -> None:
    for _, param in m.named_parameters():
        nn.init.uniform_(param.data, -0.08, 0.08)


def make_batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    srcs, trgs = [], []
    for _ in range(BATCH):
        tokens = torch.randint(3, VOCAB, (int(torch.randint(2, 5, (1,), generator=g)),), generator=g)
        srcs.append(torch.cat([torch.tensor([SOS]), tokens, torch.tensor([EOS])]))
        trgs.append(torch.cat([torch.tensor([SOS]), tokens.flip(0), torch.tensor([EOS])]))
    return nn.utils.rnn.pad_sequence(srcs, padding_value=PAD), nn.utils.rnn.pad_sequence(trgs, padding_value=PAD)


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(1234)
    random.seed(1234)
    g = torch.Generator().manual_seed(1234)
    model = Seq2Seq()
    model.apply(init_weights)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    criterion = nn.CrossEntropyLoss(ignore_index=PAD)
    with torch_sentinel.attach(model, optimizer, log_dir=log_dir) as sentinel:
        model.train()
        for _ in range(steps):
            src, trg = make_batch(g)
            optimizer.zero_grad()
            output = model(src, trg, 0.5)
            loss = criterion(output[1:].reshape(-1, VOCAB), trg[1:].reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1)
            optimizer.step()
            if progress is not None:
                progress.append(loss.item())
        return sentinel.report()
