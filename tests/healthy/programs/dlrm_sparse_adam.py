"""A DLRM-style click model: sparse embedding tables under SparseAdam, dense MLPs under Adam.

Modelled on: facebookresearch/dlrm ``dlrm_s_pytorch.py``
(https://github.com/facebookresearch/dlrm/blob/main/dlrm_s_pytorch.py): ``nn.EmbeddingBag(...,
mode="sum", sparse=True)`` tables initialised uniformly in +-sqrt(1/n), a bottom MLP for the
dense features, pairwise dot-product interaction, a top MLP with a sigmoid output and
``BCELoss``. The sparse gradients go to ``torch.optim.SparseAdam`` and the MLPs to ``Adam``, the
split the PyTorch docs recommend for ``sparse=True`` embeddings (two optimizers, both stepped
every iteration). The data are synthetic clicks whose probability depends on a hidden score of
the categorical ids and the dense features.

Why it is healthy: each step touches only the rows of the ids in the batch (about 60% of the
200-row table, 85% of the 100-row one), so a row gets no gradient on the steps its id does not
come up and SparseAdam leaves it alone then; the log-loss falls.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

MODELLED_ON = "https://github.com/facebookresearch/dlrm/blob/main/dlrm_s_pytorch.py"
TABLE_SIZES, DIM, DENSE, BATCH, BAG = (200, 100, 50), 8, 6, 64, 3


class DLRM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb_l = nn.ModuleList()
        for n in TABLE_SIZES:
            emb = nn.EmbeddingBag(n, DIM, mode="sum", sparse=True)
            nn.init.uniform_(emb.weight, -(1 / n) ** 0.5, (1 / n) ** 0.5)
            self.emb_l.append(emb)
        self.bot_l = nn.Sequential(nn.Linear(DENSE, 16), nn.ReLU(), nn.Linear(16, DIM), nn.ReLU())
        pairs = (len(TABLE_SIZES) + 1) * len(TABLE_SIZES) // 2
        self.top_l = nn.Sequential(nn.Linear(DIM + pairs, 32), nn.ReLU(), nn.Linear(32, 1), nn.Sigmoid())

    def interact_features(self, x: torch.Tensor, ly: list[torch.Tensor]) -> torch.Tensor:
        t = torch.stack([x, *ly], dim=1)
        z = torch.bmm(t, t.transpose(1, 2))
        li, lj = torch.tril_indices(t.shape[1], t.shape[1], offset=-1)
        return torch.cat([x, z[:, li, lj]], dim=1)

    def forward(self, dense_x: torch.Tensor, indices: list[torch.Tensor], offsets: torch.Tensor) -> torch.Tensor:
        x = self.bot_l(dense_x)
        ly = [emb(idx, offsets) for emb, idx in zip(self.emb_l, indices)]
        return self.top_l(self.interact_features(x, ly))


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    id_scores = [torch.randn(n, generator=g) for n in TABLE_SIZES]
    dense_w = torch.randn(DENSE, generator=g)
    model = DLRM()
    sparse_params = [p for emb in model.emb_l for p in emb.parameters()]
    dense_params = [*model.bot_l.parameters(), *model.top_l.parameters()]
    optimizers = [torch.optim.SparseAdam(sparse_params, lr=0.05), torch.optim.Adam(dense_params, lr=3e-3)]
    loss_fn = nn.BCELoss(reduction="mean")
    offsets = torch.arange(0, BATCH * BAG, BAG)
    sentinel = torch_sentinel.attach(model, optimizers, log_dir=log_dir)
    for _ in range(steps):
        dense_x = torch.randn(BATCH, DENSE, generator=g)
        indices = [torch.randint(0, n, (BATCH * BAG,), generator=g) for n in TABLE_SIZES]
        score = dense_x @ dense_w / 2 + sum(s[i].view(BATCH, BAG).sum(1) for s, i in zip(id_scores, indices))
        clicks = torch.bernoulli(torch.sigmoid(score), generator=g).unsqueeze(1)
        loss = loss_fn(model(dense_x, indices, offsets), clicks)
        for opt in optimizers:
            opt.zero_grad()
        loss.backward()
        for opt in optimizers:
            opt.step()
        if progress is not None:
            progress.append(loss.item())
    report = sentinel.report()
    sentinel.detach()
    return report
