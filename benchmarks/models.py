"""The models the overhead benchmark trains, with their data and loss.

Each factory returns a :class:`Workload`: a freshly initialised model, a few fixed batches
already on the device (so data loading is not what gets timed), and the loss. ``tiny=True``
shrinks every model to a size that trains in milliseconds, for the smoke test.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ALL_MODELS", "CPU_MODELS", "GPU_MODELS", "Workload", "build", "deep_stack", "gpt2_small"]

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclasses.dataclass
class Workload:
    model: nn.Module
    batches: list[Batch]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    description: str

    def batch(self, i: int) -> Batch:
        return self.batches[i % len(self.batches)]


def _batches(
    make: Callable[[torch.Generator], Batch], n: int, seed: int, device: torch.device
) -> list[Batch]:
    g = torch.Generator().manual_seed(seed)
    return [tuple(t.to(device) for t in make(g)) for _ in range(n)]  # type: ignore[misc]


def _token_ce(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


# ---------------------------------------------------------------------------------- MLP
def mlp(device: torch.device, tiny: bool = False) -> Workload:
    d_in, hidden, batch = (32, 64, 16) if tiny else (784, 1024, 256)
    model = nn.Sequential(
        nn.Flatten(),
        nn.Linear(d_in, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    )
    data = _batches(
        lambda g: (
            torch.randn(batch, d_in, generator=g),
            torch.randint(0, 10, (batch,), generator=g),
        ),
        4,
        1,
        device,
    )
    return Workload(
        model.to(device), data, F.cross_entropy, f"MLP {d_in}-{hidden}-{hidden}-10, batch {batch}"
    )


# ---------------------------------------------------------------------------------- CNN
def cnn(device: torch.device, tiny: bool = False) -> Workload:
    widths, side, batch = ((4, 8, 8), 8, 4) if tiny else ((32, 64, 128), 32, 64)
    layers: list[nn.Module] = []
    c_in = 3
    for i, c in enumerate(widths):
        layers += [nn.Conv2d(c_in, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU()]
        layers.append(nn.MaxPool2d(2) if i < len(widths) - 1 else nn.AdaptiveAvgPool2d(1))
        c_in = c
    model = nn.Sequential(*layers, nn.Flatten(), nn.Linear(c_in, 10))
    data = _batches(
        lambda g: (
            torch.randn(batch, 3, side, side, generator=g),
            torch.randint(0, 10, (batch,), generator=g),
        ),
        4,
        2,
        device,
    )
    return Workload(
        model.to(device),
        data,
        F.cross_entropy,
        f"CNN 3 conv+BatchNorm {widths} on {side}x{side}, batch {batch}",
    )


# ---------------------------------------------------------------------------------- transformer encoder
class EncoderClassifier(nn.Module):
    """Token embedding, ``nn.TransformerEncoder``, mean pooling and a 10-way classifier."""

    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(seq, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(
            d_model, heads, 4 * d_model, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, 10)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.pos[: tokens.shape[1]]).mean(dim=1))


def transformer(device: torch.device, tiny: bool = False) -> Workload:
    vocab, d, n_layers, heads, seq, batch = (
        (64, 16, 1, 2, 8, 2) if tiny else (1000, 256, 4, 4, 128, 16)
    )
    model = EncoderClassifier(vocab, d, n_layers, heads, seq)
    data = _batches(
        lambda g: (
            torch.randint(0, vocab, (batch, seq), generator=g),
            torch.randint(0, 10, (batch,), generator=g),
        ),
        4,
        3,
        device,
    )
    return Workload(
        model.to(device),
        data,
        F.cross_entropy,
        f"TransformerEncoder {n_layers} layers, d_model {d}, seq {seq}, batch {batch}",
    )


# ---------------------------------------------------------------------------------- GPT-style LM (GPU)
class _Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        )
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.out(self.act(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """A small decoder-only LM: learned positions, pre-norm blocks, tied output head."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(_Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for name, p in self.named_parameters():
            if name.endswith(("proj.weight", "out.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def _gpt_workload(
    device: torch.device, shape: tuple[int, int, int, int, int, int], seed: int, name: str
) -> Workload:
    """A GPT language-model workload of ``shape`` = (vocab, d, layers, heads, seq, batch)."""
    vocab, d, n_layers, heads, seq, batch = shape
    model = GPT(vocab, d, n_layers, heads, seq)
    data = _batches(
        lambda g: (
            torch.randint(0, vocab, (batch, seq), generator=g),
            torch.randint(0, vocab, (batch, seq), generator=g),
        ),
        4,
        seed,
        device,
    )
    return Workload(
        model.to(device),
        data,
        _token_ce,
        f"{name}: {n_layers} layers, d {d}, {heads} heads, seq {seq}, batch {batch}, vocab {vocab}",
    )


_TINY_GPT = (64, 16, 2, 2, 8, 2)


def gpt(device: torch.device, tiny: bool = False) -> Workload:
    return _gpt_workload(device, _TINY_GPT if tiny else (32000, 512, 8, 8, 512, 16), 4, "GPT LM")


def gpt2_small(device: torch.device, tiny: bool = False) -> Workload:
    """GPT-2 small's shape (12 layers, d 768, 12 heads, vocab 50257, context 1024), batch 8."""
    return _gpt_workload(
        device, _TINY_GPT if tiny else (50257, 768, 12, 12, 1024, 8), 6, "GPT-2 small shape"
    )


# ---------------------------------------------------------------------------------- scaling
#: Gain of the deep stack's orthogonal init: just above 1, where a tanh stack with zero biases
#: neither shrinks nor grows its signal with depth (1.0 lets the activations and the gradients
#: at the first layers shrink slowly; 1.1 grows the gradient 8x over 1,000 modules).
DEEP_STACK_GAIN = 1.05


def deep_stack(device: torch.device, n_modules: int, width: int = 64, batch: int = 32) -> Workload:
    """``n_modules`` hooked modules (Linear/Tanh pairs), for overhead vs module count.

    Initialised at the edge of chaos (orthogonal weights with gain 1.05, zero biases) so that
    activations keep their scale (rms about 0.2 at every depth) and gradients reach the first
    layer at the size they leave the last (within a few times, at 10 to 1,000 modules). With
    PyTorch's default init the gradient shrinks layer by layer: past a few hundred modules the
    backward pass computes on subnormal floats, which on x86 CPUs cost tens of times more per
    operation, so the bare step timed denormal arithmetic instead of a training step (and the
    sentinel rightly reported ``vanishing_gradient`` on it).
    """
    layers: list[nn.Module] = []
    for i in range(n_modules):
        layers.append(nn.Linear(width, width) if i % 2 == 0 else nn.Tanh())
    model = nn.Sequential(*layers)
    with torch.no_grad():
        for layer in layers:
            if isinstance(layer, nn.Linear):
                nn.init.orthogonal_(layer.weight, gain=DEEP_STACK_GAIN)
                nn.init.zeros_(layer.bias)
    data = _batches(
        lambda g: (torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)),
        2,
        5,
        device,
    )
    return Workload(
        model.to(device),
        data,
        F.mse_loss,
        f"{n_modules} modules (Linear {width}/Tanh, orthogonal init), batch {batch}",
    )


CPU_MODELS: dict[str, Callable[..., Workload]] = {
    "mlp": mlp,
    "cnn": cnn,
    "transformer": transformer,
}
GPU_MODELS: dict[str, Callable[..., Workload]] = {**CPU_MODELS, "gpt": gpt}
#: Every workload ``build`` knows; ``gpt2s`` is timed by ``benchmarks.gpu_check``.
ALL_MODELS: dict[str, Callable[..., Workload]] = {**GPU_MODELS, "gpt2s": gpt2_small}


def build(name: str, device: torch.device, tiny: bool = False, seed: int = 0) -> Workload:
    """A fresh workload; the same ``seed`` gives every variant the same initial weights."""
    torch.manual_seed(seed)
    return ALL_MODELS[name](device, tiny)
