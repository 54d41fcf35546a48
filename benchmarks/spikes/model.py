"""The benchmark's model and data: a 4-layer GPT-style byte-level LM on Python source text.

The corpus is the source of ``torch.nn.modules`` as installed (about 1.4 MB of bytes), so the
benchmark needs no download and reads the same text wherever the same torch is installed.
Batches are drawn at seeded random offsets, so batch losses vary as they do on real text
(docstrings, code, tables).

Two knobs exist only for the injections (``injections.py``), both inert in a healthy run:
``Attention.qk_drift`` adds a shared direction, scaled by it, to the queries and keys of one
attention layer (its logits grow as ``drift**2`` and its attention goes to the same positions
whatever the content: the logit growth that qk-layernorm prevents), and ``GPT.out_temperature``
multiplies the output logits (their log-sum-exp drifts, as a z-loss prevents).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPT", "Config", "Corpus", "lm_loss", "param_groups"]


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 256
    d: int = 128
    layers: int = 4
    heads: int = 4
    seq: int = 32
    batch: int = 16
    lr: float = 1e-3
    beta2: float = 0.95
    weight_decay: float = 0.1
    warmup: int = 50
    clip: Optional[float] = 1.0


class Attention(nn.Module):
    """Causal self-attention through ``F.scaled_dot_product_attention``."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        #: Injection knob: the queries and keys move along ``direction`` by this much (0 when healthy).
        self.qk_drift = 0.0
        #: The attention function; None: ``F.scaled_dot_product_attention`` as it is at the call
        #: (the overhead benchmark hands its baseline copies the function from before any attach).
        self.sdpa: Optional[Callable[..., torch.Tensor]] = None
        g = torch.Generator().manual_seed(heads * 1000 + d)
        direction = torch.randn(heads, 1, d // heads, generator=g)
        self.register_buffer("direction", direction / direction.norm(dim=-1, keepdim=True), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        dh = d // self.heads
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, dh).permute(2, 0, 3, 1, 4)
        if self.qk_drift:
            q = q + self.qk_drift * self.direction
            k = k + self.qk_drift * self.direction
        y = (self.sdpa or F.scaled_dot_product_attention)(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Pre-norm decoder-only LM with learned positions and an untied output head."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.d)
        self.pos_emb = nn.Embedding(cfg.seq, cfg.d)
        self.blocks = nn.ModuleList(Block(cfg.d, cfg.heads) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d)
        self.head = nn.Linear(cfg.d, cfg.vocab, bias=False)
        #: Injection knob: multiplies the output logits (1.0 when healthy).
        self.out_temperature = 1.0
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * cfg.layers) if name.endswith(("proj.weight", "fc2.weight")) else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        # Only an injected run scales the logits: a healthy GPT returns its head's output as it is
        # (nanoGPT, HF), and the overhead benchmark times this model as one.
        return logits if self.out_temperature == 1.0 else logits * self.out_temperature


def param_groups(model: GPT) -> list[dict[str, object]]:
    """One AdamW param group per block, one for the embeddings, one for the final norm and
    head: a layer-wise layout (as layer-wise lr decay uses), so one group's lr can change."""
    groups: list[dict[str, object]] = [
        {"name": "embed", "params": [*model.tok_emb.parameters(), *model.pos_emb.parameters()]}
    ]
    for i, block in enumerate(model.blocks):
        groups.append({"name": f"blocks.{i}", "params": list(block.parameters())})
    groups.append({"name": "head", "params": [*model.ln_f.parameters(), *model.head.parameters()]})
    return groups


class Corpus:
    """Bytes of the installed ``torch/nn/modules/*.py``, cut into seeded random windows."""

    def __init__(self) -> None:
        root = pathlib.Path(nn.__file__).parent / "modules"
        text = b"\n".join(p.read_bytes() for p in sorted(root.glob("*.py")))
        self.data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()

    def batch(self, g: torch.Generator, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, len(self.data) - seq - 1, (batch,), generator=g)
        rows = torch.stack([self.data[s : s + seq + 1] for s in starts.tolist()])
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
