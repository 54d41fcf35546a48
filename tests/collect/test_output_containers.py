"""A model's outputs are found in whatever it returns: a dataclass, an HF ``ModelOutput``, or an
object the collector cannot look into. A backward through them belongs to the model before its
gradients land, so a loop that clears its gradients gets no ``missing_zero_grad`` (a dataclass
output used to: the backward was taken for a graph cut and counted after it ran, when its own
gradients looked stale), and a loop that does not clear them still gets one."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import pytest
import torch
from helpers import Scale
from torch import nn

import torch_sentinel

transformers = pytest.importorskip("transformers")


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    hidden: torch.Tensor


class Opaque:
    """Holds the tensors as attributes of a class the collector knows nothing about."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits


class Net(nn.Module):
    def __init__(self, wrap: Callable[[torch.Tensor, torch.Tensor], Any]) -> None:
        super().__init__()
        self.fc = nn.Linear(12, 32)
        self.act = nn.ReLU()
        self.head = nn.Linear(32, 3)
        self.scale = Scale()
        self.wrap = wrap

    def forward(self, x: torch.Tensor) -> Any:
        hidden = self.act(self.fc(x))
        return self.wrap(self.scale(self.head(hidden)), hidden)


def _bert() -> nn.Module:
    config = transformers.BertConfig(num_hidden_layers=1, num_attention_heads=2, hidden_size=16,
                                     intermediate_size=32, vocab_size=50, max_position_embeddings=16,
                                     num_labels=3)
    return transformers.BertForSequenceClassification(config)


MODELS: dict[str, Callable[[], nn.Module]] = {
    "dataclass": lambda: Net(Output),
    "hf-model-output": _bert,
    "opaque-object": lambda: Net(lambda logits, hidden: Opaque(logits)),
}


def _batch(kind: str, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(0, 50, (8, 10), generator=g) if kind == "hf-model-output" else torch.randn(8, 12, generator=g)
    return x, torch.randint(0, 3, (8,), generator=g)


@pytest.mark.parametrize("check", ["immediate", "deferred"], ids=["immediate", "deferred"])
@pytest.mark.parametrize("clears", [True, False], ids=["zero-grad", "no-zero-grad"])
@pytest.mark.parametrize("kind", list(MODELS), ids=list(MODELS))
def test_missing_zero_grad_reads_the_loop_not_the_output_type(kind: str, clears: bool, check: str) -> None:
    torch.manual_seed(0)
    model = MODELS[kind]()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    with torch_sentinel.attach(model, opt, check=check) as s:
        for _ in range(12):
            x, y = _batch(kind, g)
            if clears:
                opt.zero_grad()
            nn.functional.cross_entropy(model(x).logits, y).backward()
            opt.step()
    found = [f for f in s.report().findings if f.kind == "missing_zero_grad"]
    assert bool(found) == (not clears), found


@pytest.mark.parametrize("check", ["immediate", "deferred"], ids=["immediate", "deferred"])
def test_a_nan_in_a_dataclass_output_is_charged_to_its_module(check: str) -> None:
    torch.manual_seed(0)
    model = Net(Output)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    with torch_sentinel.attach(model, opt, check=check), pytest.raises(torch_sentinel.NonFiniteError) as info:
        for step in range(30):  # past the densely sampled first steps: an ordinary step
            if step == 23:
                model.scale.factor.fill_(math.nan)
            x, y = _batch("dataclass", g)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x).logits, y).backward()
            opt.step()
    assert (info.value.step, info.value.boundary, info.value.module) == (23, "forward", "scale")
