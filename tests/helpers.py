"""Small real models and the user's plain training loop, shared by the tests."""

from __future__ import annotations

import importlib.util
import pathlib
from types import ModuleType
from typing import Callable, Optional

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, d_in: int = 20, hidden: int = 32, d_out: int = 4) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(hidden, hidden)
        self.act2 = nn.ReLU()
        self.head = nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act2(self.fc2(self.act(self.fc1(x)))))


class Scale(nn.Module):
    """Multiplies by a buffer: the buffer going NaN makes this layer emit NaN from finite inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("factor", torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


class CNN(nn.Module):
    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class Transformer(nn.Module):
    def __init__(self, vocab: int = 50, d_model: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(1))


class EncoderDecoder(nn.Module):
    """Linear(20, 32) -> ReLU -> Linear(16, 4): a planted feature mismatch at the decoder."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(20, 32)
        self.act = nn.ReLU()
        self.decoder = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.act(self.encoder(x)))


def make_batch(kind: str, n: int = 16, generator: Optional[torch.Generator] = None) -> tuple[torch.Tensor, torch.Tensor]:
    g = generator
    if kind == "mlp":
        return torch.randn(n, 20, generator=g), torch.randint(0, 4, (n,), generator=g)
    if kind == "cnn":
        return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 4, (n,), generator=g)
    if kind == "transformer":
        return torch.randint(0, 50, (n, 12), generator=g), torch.randint(0, 4, (n,), generator=g)
    raise ValueError(kind)


MODELS: dict[str, Callable[[], nn.Module]] = {"mlp": MLP, "cnn": CNN, "transformer": Transformer}


def train(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    kind: str,
    steps: int,
    *,
    corrupt: Optional[Callable[[int, torch.Tensor], torch.Tensor]] = None,
    seed: int = 0,
) -> list[float]:
    """The user's loop, untouched by the sentinel. Returns the losses it computed."""
    g = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(steps):
        x, y = make_batch(kind, generator=g)
        if corrupt is not None:
            x = corrupt(step, x)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


EXAMPLES = pathlib.Path(__file__).parent.parent / "examples"


def load_program(path: pathlib.Path, prefix: str) -> ModuleType:
    """Import an example program (examples/faults, examples/healthy) by path."""
    spec = importlib.util.spec_from_file_location(f"{prefix}_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
