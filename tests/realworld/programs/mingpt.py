"""minGPT learning to sort digits: explicit causal mask and softmax in the attention, AdamW
with decay/no-decay groups chosen by module type, a DataLoader-style trainer with clipping.

Modelled on: karpathy/minGPT ``mingpt/model.py`` (``CausalSelfAttention`` with a registered
lower-triangular ``bias`` buffer, ``att.masked_fill(self.bias[:, :, :T, :T] == 0,
float('-inf'))`` then ``F.softmax``; ``configure_optimizers`` putting Linear weights in the
decay group and LayerNorm/Embedding weights and all biases in the no-decay group) and
``mingpt/trainer.py`` (``model.zero_grad(set_to_none=True)``, ``loss.backward()``,
``clip_grad_norm_(model.parameters(), 1.0)``, ``optimizer.step()``), with the ``SortDataset``
of ``demo.ipynb`` (targets -1 on the prompt, ``ignore_index=-1``).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from realworld.harness import Bug
from torch import nn

import torch_sentinel

MODELLED_ON = "karpathy/minGPT mingpt/model.py + mingpt/trainer.py (demo.ipynb SortDataset)"
HEALTHY_XFAIL: Optional[str] = None
BUGS = {
    "inverted_causal_mask": Bug("masked_fill(self.bias[:, :, :T, :T] == 1, float('-inf'))",
                                "non_finite", module="h.0.attn", nonfinite=True),
    "no_decay_group_only": Bug("torch.optim.AdamW(optim_groups[1]['params'], ...) (decay group lost)",
                               "unregistered_parameter"),
}

LENGTH, DIGITS = 6, 3


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, heads: int, block: int, inverted: bool) -> None:
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.heads = heads
        self.register_buffer("bias", torch.tril(torch.ones(block, block)).view(1, 1, block, block))
        self.masked_value = 1 if inverted else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == self.masked_value, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, block: int, inverted: bool) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, block, inverted)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, d: int = 32, layers: int = 2, heads: int = 4, inverted: bool = False) -> None:
        super().__init__()
        block = 2 * LENGTH - 1
        self.wte = nn.Embedding(DIGITS, d)
        self.wpe = nn.Embedding(block, d)
        self.h = nn.ModuleList(Block(d, heads, block, inverted) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, DIGITS, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, DIGITS), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, lr: float, only_no_decay: bool) -> torch.optim.Optimizer:
        decay, no_decay = set(), set()
        for mn, m in self.named_modules():
            for pn, _ in m.named_parameters(recurse=False):
                fpn = f"{mn}.{pn}" if mn else pn
                if pn.endswith("weight") and isinstance(m, nn.Linear):
                    decay.add(fpn)
                else:
                    no_decay.add(fpn)
        params = dict(self.named_parameters())
        optim_groups = [
            {"params": [params[n] for n in sorted(decay)], "weight_decay": 0.1},
            {"params": [params[n] for n in sorted(no_decay)], "weight_decay": 0.0},
        ]
        if only_no_decay:
            return torch.optim.AdamW(optim_groups[1]["params"], lr=lr, betas=(0.9, 0.95))
        return torch.optim.AdamW(optim_groups, lr=lr, betas=(0.9, 0.95))


def sort_batch(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    inp = torch.randint(0, DIGITS, (n, LENGTH), generator=g)
    cat = torch.cat((inp, torch.sort(inp, dim=1)[0]), dim=1)
    x, y = cat[:, :-1].clone(), cat[:, 1:].clone()
    y[:, :LENGTH - 1] = -1  # predict only the sorted half
    return x, y


def run(bug: Optional[str] = None, log_dir: Optional[str] = None) -> list[float]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model = GPT(inverted=bug == "inverted_causal_mask")
    optimizer = model.configure_optimizers(5e-3, only_no_decay=bug == "no_decay_group_only")
    losses: list[float] = []
    with torch_sentinel.attach(model, optimizer, log_dir=log_dir):
        model.train()
        for _it in range(40):
            x, y = sort_batch(32, g)
            _, loss = model(x, y)
            model.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
    return losses
