"""A two-layer graph convolutional network (Kipf & Welling), full-batch, in plain torch with ``torch.spmm``.

Modelled on: tkipf/pygcn (https://github.com/tkipf/pygcn, ``pygcn/layers.py``
``GraphConvolution``: ``support = input @ weight; output = torch.spmm(adj, support) + bias`` with
weights and biases uniform in +-1/sqrt(out_features); ``models.py`` ``GCN``: ReLU, dropout 0.5,
``log_softmax``; ``train.py``: Adam lr 0.01, weight decay 5e-4, 16 hidden units, ``nll_loss`` on
the training nodes only, the validation loss computed in ``eval()`` every epoch; ``utils.py``:
row-normalised features and ``D^-1 (A + I)`` adjacency as a sparse tensor). The graph is a
stochastic block model: 300 nodes in 3 communities, 60 labelled training nodes, bag-of-words-like
binary features that are noisy indicators of the community.

Why it is healthy: every epoch is the same full batch, so the training loss falls smoothly; the
validation loss falls with it and flattens (dropout and weight decay keep it from rising).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parameter import Parameter

import torch_sentinel

MODELLED_ON = "https://github.com/tkipf/pygcn"
NODES, COMMUNITIES, FEATURES = 300, 3, 50


class GraphConvolution(nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = Parameter(torch.FloatTensor(in_features, out_features))
        self.bias = Parameter(torch.FloatTensor(out_features))
        stdv = 1.0 / math.sqrt(out_features)
        self.weight.data.uniform_(-stdv, stdv)
        self.bias.data.uniform_(-stdv, stdv)

    def forward(self, input: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        return torch.spmm(adj, torch.mm(input, self.weight)) + self.bias


class GCN(nn.Module):
    def __init__(self, nfeat: int, nhid: int, nclass: int, dropout: float) -> None:
        super().__init__()
        self.gc1 = GraphConvolution(nfeat, nhid)
        self.gc2 = GraphConvolution(nhid, nclass)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.gc1(x, adj))
        x = F.dropout(x, self.dropout, training=self.training)
        return F.log_softmax(self.gc2(x, adj), dim=1)


def make_graph(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    labels = torch.arange(NODES) % COMMUNITIES
    same = labels[:, None] == labels[None, :]
    p = torch.where(same, torch.tensor(0.05), torch.tensor(0.005))
    upper = torch.triu(torch.bernoulli(p, generator=g), diagonal=1)
    adj = upper + upper.T + torch.eye(NODES)
    adj = adj / adj.sum(1, keepdim=True)  # D^-1 (A + I), as pygcn's normalize()
    topic = torch.rand(COMMUNITIES, FEATURES, generator=g) < 0.2
    probs = torch.where(topic[labels], torch.tensor(0.3), torch.tensor(0.1))
    features = torch.bernoulli(probs, generator=g)
    features = features / features.sum(1, keepdim=True).clamp(min=1)
    return features, adj.to_sparse(), labels


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(42)
    g = torch.Generator().manual_seed(42)
    features, adj, labels = make_graph(g)
    order = torch.randperm(NODES, generator=g)
    idx_train, idx_val = order[:60], order[60:160]
    model = GCN(nfeat=FEATURES, nhid=16, nclass=COMMUNITIES, dropout=0.5)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    sentinel = torch_sentinel.attach(model, optimizer, log_dir=log_dir)
    for _epoch in range(steps):
        model.train()
        optimizer.zero_grad()
        output = model(features, adj)
        loss_train = F.nll_loss(output[idx_train], labels[idx_train])
        loss_train.backward()
        optimizer.step()
        model.eval()
        with torch.no_grad():
            output = model(features, adj)
            loss_val = F.nll_loss(output[idx_val], labels[idx_val])
        sentinel.observe_validation(loss_val)
        if progress is not None:
            progress.append(loss_val.item())
    report = sentinel.report()
    sentinel.detach()
    return report
