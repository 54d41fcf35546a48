"""A tiny GPT trained the nanoGPT way: AdamW with decay groups, warm-up + cosine schedule set by
hand every iteration, gradient accumulation, clipping, bf16 autocast and a (disabled) GradScaler.

Modelled on: karpathy/nanoGPT ``train.py`` (``get_lr(it)``: linear warm-up, cosine decay to
``min_lr`` until ``lr_decay_iters``, then ``min_lr``; ``gradient_accumulation_steps`` micro-steps
of ``loss / gradient_accumulation_steps`` through ``scaler.scale(loss).backward()``;
``scaler.unscale_`` + ``clip_grad_norm_(model.parameters(), grad_clip)``; ``scaler.step``,
``scaler.update``, ``optimizer.zero_grad(set_to_none=True)``; ``torch.amp.autocast`` with
bfloat16 and ``GradScaler(enabled=(dtype == 'float16'))``) and ``model.py`` (``GPT`` with
``wte.weight = lm_head.weight`` tying, ``configure_optimizers``: weight decay on >= 2-D params only).

Data: token streams from a fixed successor table (next token = table[token] 85% of the time).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from realworld.harness import Bug
from torch import nn

import torch_sentinel

MODELLED_ON = "karpathy/nanoGPT train.py + model.py"
HEALTHY_XFAIL: Optional[str] = None
BUGS = {
    "no_zero_grad": Bug("optimizer.zero_grad(set_to_none=True) deleted after scaler.update()",
                        "missing_zero_grad"),
    "decay_to_zero_early": Bug("lr_decay_iters = 16 with min_lr = 0.0 (run is 40 iters)",
                               "no_update", onset=17),
    "lr_x100": Bug("learning_rate = 3e-3 * 100", ("update_ratio", "diverging")),
}

VOCAB, BLOCK = 16, 12


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, d: int = 32, layers: int = 2, heads: int = 2) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, d)
        self.wpe = nn.Embedding(BLOCK, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, VOCAB, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, VOCAB).float(), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, weight_decay: float, lr: float) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def get_batch(table: torch.Tensor, g: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    seq = torch.empty(n, BLOCK + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
    for t in range(BLOCK):
        keep = torch.rand(n, generator=g) < 0.85
        seq[:, t + 1] = torch.where(keep, table[seq[:, t]], torch.randint(0, VOCAB, (n,), generator=g))
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def run(bug: Optional[str] = None, log_dir: Optional[str] = None) -> list[float]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    table = torch.randperm(VOCAB, generator=g)
    learning_rate = 3e-3 * (100 if bug == "lr_x100" else 1)
    max_iters, warmup_iters, lr_decay_iters = 40, 4, 40
    min_lr = learning_rate / 10
    if bug == "decay_to_zero_early":
        lr_decay_iters, min_lr = 16, 0.0
    grad_accum, grad_clip = 2, 1.0

    def get_lr(it: int) -> float:
        if it < warmup_iters:
            return learning_rate * (it + 1) / (warmup_iters + 1)
        if it > lr_decay_iters:
            return min_lr
        ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)

    model = GPT()
    optimizer = model.configure_optimizers(0.1, learning_rate)
    scaler = torch.amp.GradScaler("cpu", enabled=False)  # enabled only for float16
    ctx = torch.autocast("cpu", dtype=torch.bfloat16)
    losses: list[float] = []
    with torch_sentinel.attach(model, optimizer, log_dir=log_dir):
        x, y = get_batch(table, g, 8)
        for it in range(max_iters):
            for group in optimizer.param_groups:
                group["lr"] = get_lr(it)
            for _micro in range(grad_accum):
                with ctx:
                    _, loss = model(x, y)
                    loss = loss / grad_accum
                x, y = get_batch(table, g, 8)
                scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            scaler.step(optimizer)
            scaler.update()
            if bug != "no_zero_grad":
                optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item() * grad_accum)
    return losses
