"""A tiny Vision Transformer: patch embedding, class token, pre-norm blocks, AdamW, warm-up then cosine.

Modelled on: lucidrains/vit-pytorch ``vit_pytorch/vit.py``
(https://github.com/lucidrains/vit-pytorch/blob/main/vit_pytorch/vit.py: patches flattened and
projected through ``LayerNorm -> Linear -> LayerNorm``, a learnable ``cls_token`` and
``pos_embedding`` drawn from ``randn``, pre-norm ``Attention`` and ``FeedForward`` blocks with GELU,
``mlp_head = Linear`` on the class token after a final ``LayerNorm``) with the CIFAR training
recipe of omihub777/ViT-CIFAR (https://github.com/omihub777/ViT-CIFAR: AdamW, lr 1e-3, weight
decay 5e-5, linear warm-up then cosine decay, label smoothing 0.1). Images: 16x16x3 with one of
five textures in a random quadrant, plus noise.

Why it is healthy: the learnable position embedding starts at unit scale (``randn``) as in
vit-pytorch, larger than the patch embeddings; attention learns to find the textured quadrant
and the smoothed loss falls to its floor (0.39, the entropy of the smoothed targets for
smoothing 0.1 over five classes).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

import torch_sentinel

MODELLED_ON = "https://github.com/lucidrains/vit-pytorch/blob/main/vit_pytorch/vit.py"
IMAGE, PATCH, DIM, DEPTH, HEADS, MLP_DIM, CLASSES, BATCH, WARMUP = 16, 4, 48, 2, 4, 96, 5, 32, 30


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int) -> None:
        super().__init__()
        inner = dim_head * heads
        self.heads, self.scale = heads, dim_head**-0.5
        self.norm = nn.LayerNorm(dim)
        self.attend = nn.Softmax(dim=-1)
        self.to_qkv = nn.Linear(dim, inner * 3, bias=False)
        self.to_out = nn.Linear(inner, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = (t.reshape(b, n, self.heads, -1).transpose(1, 2) for t in self.to_qkv(self.norm(x)).chunk(3, dim=-1))
        attn = self.attend(torch.matmul(q, k.transpose(-1, -2)) * self.scale)
        return self.to_out(torch.matmul(attn, v).transpose(1, 2).reshape(b, n, -1))


class ViT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        patch_dim = 3 * PATCH * PATCH
        num_patches = (IMAGE // PATCH) ** 2
        self.to_patch_embedding = nn.Sequential(nn.LayerNorm(patch_dim), nn.Linear(patch_dim, DIM), nn.LayerNorm(DIM))
        self.pos_embedding = nn.Parameter(torch.randn(1, num_patches + 1, DIM))
        self.cls_token = nn.Parameter(torch.randn(1, 1, DIM))
        self.layers = nn.ModuleList([nn.ModuleList([Attention(DIM, HEADS, DIM // HEADS), FeedForward(DIM, MLP_DIM)])
                                     for _ in range(DEPTH)])
        self.norm = nn.LayerNorm(DIM)
        self.mlp_head = nn.Linear(DIM, CLASSES)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        b = img.shape[0]
        p = img.unfold(2, PATCH, PATCH).unfold(3, PATCH, PATCH)  # b c h w p p
        patches = p.permute(0, 2, 3, 4, 5, 1).reshape(b, -1, 3 * PATCH * PATCH)
        x = self.to_patch_embedding(patches)
        x = torch.cat([self.cls_token.expand(b, -1, -1), x], dim=1) + self.pos_embedding
        for attn, ff in self.layers:
            x = attn(x) + x
            x = ff(x) + x
        return self.mlp_head(self.norm(x)[:, 0])


def textures(labels: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    n = len(labels)
    r = torch.arange(8.0)
    yy, xx = torch.meshgrid(r, r, indexing="ij")
    freq = (1 + labels.float())[:, None, None] * 0.6
    tile = torch.sin(freq * xx) * torch.cos(freq * yy)
    img = 0.6 * torch.randn(n, 3, IMAGE, IMAGE, generator=g)
    quadrant = torch.randint(0, 4, (n,), generator=g)
    for i in range(n):
        top, left = 8 * (int(quadrant[i]) // 2), 8 * (int(quadrant[i]) % 2)
        img[i, :, top:top + 8, left:left + 8] += tile[i]
    return img


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = ViT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=5e-5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / WARMUP if s < WARMUP else 0.5 * (1 + math.cos(math.pi * (s - WARMUP) / (steps - WARMUP))))
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    sentinel = torch_sentinel.attach(model, optimizer, log_dir=log_dir)
    for _ in range(steps):
        labels = torch.randint(0, CLASSES, (BATCH,), generator=g)
        loss = criterion(model(textures(labels, g)), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        if progress is not None:
            progress.append(loss.item())
    report = sentinel.report()
    sentinel.detach()
    return report
