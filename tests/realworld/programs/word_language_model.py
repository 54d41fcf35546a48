"""An LSTM language model with tied weights, gradient clipping and a hand-written SGD update.

Modelled on: pytorch/examples ``word_language_model/main.py`` and ``model.py`` (``RNNModel``
with ``--tied``: the decoder shares the encoder's weight; truncated BPTT with
``repackage_hidden``; ``model.zero_grad()``, ``clip_grad_norm_(model.parameters(), 0.25)`` and
then ``p.data.add_(p.grad, alpha=-lr)`` for every parameter: there is no optimizer object).
The sentinel is attached without an optimizer, as that script would have to.

Data: a stream of tokens from a fixed random "grammar": each token determines the next one with
probability 0.9, so the next-token loss can fall well below ln(vocab).
"""

from __future__ import annotations

from typing import Optional

import torch
from realworld.harness import Bug
from torch import nn

import torch_sentinel

MODELLED_ON = "pytorch/examples word_language_model/main.py (+ model.py, --tied)"
HEALTHY_XFAIL: Optional[str] = None
BUGS = {
    # attach(model) without an optimizer: each backward() is a step (issue 11).
    "no_zero_grad": Bug("model.zero_grad() deleted before loss.backward()", "missing_zero_grad"),
    "eval_left_on": Bug("model.train() missing at the start of train() after evaluate()",
                        "eval_mode_training", module="", onset=20),
    "lr_x100": Bug("lr = 20 * 100 (the example's --lr 20, times 100)", "diverging"),
}

VOCAB = 24


class RNNModel(nn.Module):
    def __init__(self, ntoken: int = VOCAB, nhid: int = 32) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.2)
        self.encoder = nn.Embedding(ntoken, nhid)
        self.rnn = nn.LSTM(nhid, nhid, 1)
        self.decoder = nn.Linear(nhid, ntoken)
        self.decoder.weight = self.encoder.weight  # --tied
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, tokens: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]):
        emb = self.drop(self.encoder(tokens))
        out, hidden = self.rnn(emb, hidden)
        return self.decoder(self.drop(out)), hidden

    def init_hidden(self, bsz: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(1, bsz, self.rnn.hidden_size), torch.zeros(1, bsz, self.rnn.hidden_size)


def make_stream(n: int, g: torch.Generator) -> torch.Tensor:
    successor = torch.randperm(VOCAB, generator=g)
    tokens = [0]
    noise = torch.rand(n, generator=g)
    jumps = torch.randint(0, VOCAB, (n,), generator=g)
    for i in range(n - 1):
        tokens.append(int(successor[tokens[-1]]) if noise[i] < 0.9 else int(jumps[i]))
    return torch.tensor(tokens)


def train(model: RNNModel, source: torch.Tensor, target: torch.Tensor, lr: float,
          bug: Optional[str]) -> list[float]:
    """One epoch of truncated BPTT with the example's hand-written SGD update."""
    bptt, clip = 12, 0.25
    criterion = nn.NLLLoss()
    losses = []
    hidden = model.init_hidden(source.size(1))
    for i in range(0, source.size(0), bptt):
        x, y = source[i:i + bptt], target[i:i + bptt]
        hidden = (hidden[0].detach(), hidden[1].detach())  # repackage_hidden
        if bug != "no_zero_grad":
            model.zero_grad()
        output, hidden = model(x, hidden)
        loss = criterion(torch.log_softmax(output, -1).view(-1, VOCAB), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        losses.append(loss.item())
    return losses


def run(bug: Optional[str] = None, log_dir: Optional[str] = None) -> list[float]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    bsz, span = 8, 20 * 12  # 20 BPTT windows of 12 tokens per epoch
    data = make_stream(bsz * span * 2 + 1, g)
    source = data[:-1].view(bsz, -1).t().contiguous()  # batchify: (len, bsz)
    target = data[1:].view(bsz, -1).t().contiguous()
    model = RNNModel()
    lr = 20.0 * (100 if bug == "lr_x100" else 1)
    losses: list[float] = []
    with torch_sentinel.attach(model, log_dir=log_dir):
        for epoch in range(2):
            if epoch == 0 or bug != "eval_left_on":
                model.train()
            window = slice(span * epoch, span * (epoch + 1))
            losses += train(model, source[window], target[window], lr, bug)
            model.eval()  # evaluate(val_data)
            with torch.no_grad():
                model(source[:12], model.init_hidden(bsz))
    return losses
