"""A mesh-reconstruction network (CMR-style) regularises its predicted mesh with a loss on edge
lengths computed as ``sqrt(((v_i - v_j) ** 2).sum())``. The template has two coincident vertices
(a seam) joined by an edge, and the deformation head starts at zero, so that edge has length
exactly 0: the forward is finite, but the derivative of sqrt at 0 is infinite and the backward
returns NaN gradients from the first step. The fix: an epsilon inside the square root (or drop
zero-length edges).

Source: akanazawa/cmr#11 "triangle_loss_fn returns 'nan'" ("the gradient of 'sqrt' is not
defined at 0"), https://github.com/akanazawa/cmr/issues/11 ; pytorch/pytorch#2421 "Gradient of
zero norm is nan", https://github.com/pytorch/pytorch/issues/2421 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/akanazawa/cmr/issues/11; https://github.com/pytorch/pytorch/issues/2421"
CLASS = "NaN gradient from sqrt at 0 in a hand-written loss"
KIND, MODULE, CAUSE, ONSET = "non_finite", None, "local_gradients", 0

# a strip of 5 quads: 12 vertices; vertices 0 and 11 coincide (the seam), joined by an edge
_TEMPLATE = torch.tensor([[i % 6, i // 6, 0.0] for i in range(11)] + [[0.0, 0.0, 0.0]])
_EDGES = torch.tensor([[i, i + 1] for i in range(5)] + [[i, i + 1] for i in range(6, 11)]
                      + [[i, i + 6] for i in range(6)] + [[0, 11]])


class MeshNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(32, 64), nn.ReLU())
        self.deform = nn.Linear(64, 12 * 3)
        nn.init.zeros_(self.deform.weight)  # start from the template, as mesh predictors do
        nn.init.zeros_(self.deform.bias)

    def forward(self, img_feat: torch.Tensor) -> torch.Tensor:
        return _TEMPLATE + self.deform(self.encoder(img_feat)).view(-1, 12, 3)


def edge_lengths(verts: torch.Tensor, bug: bool) -> torch.Tensor:
    d = verts[:, _EDGES[:, 0]] - verts[:, _EDGES[:, 1]]
    sq = (d ** 2).sum(-1)
    return sq.sqrt() if bug else (sq + 1e-8).sqrt()  # the bug: sqrt at exactly 0


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = MeshNet()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(30):
            feat = torch.randn(16, 32, generator=g)
            target_kp = _TEMPLATE[:6, :2] * (1 + 0.1 * feat[:, :1, None])  # keypoints seen in the image
            verts = model(feat)
            kp_loss = nn.functional.mse_loss(verts[:, :6, :2], target_kp)
            smooth = edge_lengths(verts, bug).var(1).mean()  # edges of even length
            opt.zero_grad()
            (kp_loss + 0.1 * smooth).backward()
            opt.step()
            watch(s)
        return s.report()
