"""An LSTM language model with tied input/output embeddings, SGD at lr 30, clipping at 0.25, truncated BPTT.

Modelled on: salesforce/awd-lstm-lm (https://github.com/salesforce/awd-lstm-lm, ``model.py``
``RNNModel``: ``self.decoder.weight = self.encoder.weight`` when ``tie_weights``, embedding
initialised uniformly in +-0.1, decoder bias zero, dropout on embeddings and outputs;
``main.py``: ``torch.optim.SGD(params, lr=30, weight_decay=1.2e-6)``,
``clip_grad_norm_(params, 0.25)``, BPTT windows of ~70 tokens with the hidden state carried
over and detached (``repackage_hidden``), lr rescaled by ``seq_len / bptt`` for variable-length
windows). Here: a 1-layer LSTM of 64 units with 64-dim embeddings (tying needs equal sizes), BPTT
20 with random lengths, batch 16, on a synthetic corpus from a small first-order Markov chain.

Why it is healthy: the huge learning rate is paired with a tiny clipping threshold, so each step
moves the weights by at most lr x 0.25 in norm (7.5 at the base rate), which this recipe relies
on; the tied matrix gets gradient from both ends; the loss falls from ln 50 to about 1.45.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

MODELLED_ON = "https://github.com/salesforce/awd-lstm-lm/blob/master/model.py"
NTOKEN, NINP, NHID, BPTT, BATCH, LR, CLIP = 50, 64, 64, 20, 16, 30.0, 0.25


class RNNModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.2)
        self.encoder = nn.Embedding(NTOKEN, NINP)
        self.rnn = nn.LSTM(NINP, NHID)
        self.decoder = nn.Linear(NHID, NTOKEN)
        self.decoder.weight = self.encoder.weight  # tie_weights
        self.encoder.weight.data.uniform_(-0.1, 0.1)
        self.decoder.bias.data.fill_(0)

    def forward(self, input: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        return self.decoder(self.drop(output)), hidden

    def init_hidden(self, bsz: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(1, bsz, NHID), torch.zeros(1, bsz, NHID)


def repackage_hidden(h: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return (h[0].detach(), h[1].detach())


def markov_corpus(g: torch.Generator, length: int) -> torch.Tensor:
    transitions = torch.softmax(3 * torch.randn(NTOKEN, NTOKEN, generator=g), dim=1)
    tokens = [0]
    for _ in range(length - 1):
        tokens.append(int(torch.multinomial(transitions[tokens[-1]], 1, generator=g)))
    return torch.tensor(tokens)


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(1111)
    g = torch.Generator().manual_seed(1111)
    data = markov_corpus(g, 16000)
    train_data = data[: len(data) // BATCH * BATCH].view(BATCH, -1).t().contiguous()  # batchify
    model = RNNModel()
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=LR, weight_decay=1.2e-6)
    criterion = nn.CrossEntropyLoss()
    sentinel = torch_sentinel.attach(model, optimizer, log_dir=log_dir)
    hidden = model.init_hidden(BATCH)
    i = 0
    model.train()
    for _ in range(steps):
        bptt = BPTT if float(torch.rand(1, generator=g)) < 0.95 else BPTT / 2
        seq_len = max(5, int(bptt + 3 * float(torch.randn(1, generator=g))))
        if i + seq_len + 1 >= train_data.size(0):
            i, hidden = 0, model.init_hidden(BATCH)
        x, targets = train_data[i:i + seq_len], train_data[i + 1:i + 1 + seq_len].reshape(-1)
        i += seq_len
        optimizer.param_groups[0]["lr"] = LR * seq_len / BPTT
        hidden = repackage_hidden(hidden)
        optimizer.zero_grad()
        output, hidden = model(x, hidden)
        loss = criterion(output.view(-1, NTOKEN), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        optimizer.step()
        optimizer.param_groups[0]["lr"] = LR
        if progress is not None:
            progress.append(loss.item())
    report = sentinel.report()
    sentinel.detach()
    return report
