"""Shape errors inside an attached model keep their type and gain a note; a finding is recorded."""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from helpers import EncoderDecoder
from torch import nn

import torch_sentinel


class Wrap(nn.Module):
    """One layer inside a container, fed the batch directly."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.body = nn.Sequential(layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class Raises(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("the data loader ran dry")


def _notes(exc: BaseException) -> list[str]:
    return [n for n in getattr(exc, "__notes__", []) if n.startswith("torch_sentinel:")]


def test_linear_mismatch_note_names_module_contract_shapes_and_producer() -> None:
    model = EncoderDecoder()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_sentinel.attach(model, opt) as sentinel:
        with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(8x32 and 16x4\)") as info:
            model(torch.randn(8, 20))
        assert type(info.value) is RuntimeError  # the original type, not a sentinel error
        notes = _notes(info.value)
        assert len(notes) == 1  # once, at the innermost module, not again at the root
        note = notes[0]
        assert "shape mismatch in module 'decoder' (Linear) at step 0" in note
        assert "Linear(in_features=16, out_features=4)" in note
        assert "Feature mismatch: input has 32 features, but decoder expects 16" in note
        assert "args[0] (8, 32) float32, produced by module 'act' (ReLU)" in note
        assert "the inner dimensions are 32 and 16" in note
        report = sentinel.report()
    found = report.by_kind("shape_mismatch")
    assert len(found) == 1
    f = found[0]
    assert (f.boundary, f.module, f.step, f.severity) == ("shapes", "decoder", 0, "error")
    assert f.evidence["arrived"] == [[8, 32]]
    assert report.boundary == "shapes"
    assert report.next_check == "name_the_axes_and_fix_the_layer_contract"


@pytest.mark.parametrize(
    ("layer", "batch", "error", "words"),
    [
        (nn.Conv2d(3, 8, 3), lambda: torch.randn(2, 4, 8, 8), RuntimeError,
         "Channel mismatch: input has 4 channels, but body.0 expects 3"),
        (nn.LayerNorm(16), lambda: torch.randn(2, 32), RuntimeError,
         "Normalized-shape mismatch: input's trailing dimensions are (32,), but body.0 normalizes over (16,)"),
        (nn.BatchNorm1d(16), lambda: torch.randn(4, 32), RuntimeError,
         "Feature mismatch: input has 32 channels at dim 1, but body.0 expects 16"),
        (nn.Embedding(10, 4), lambda: torch.tensor([[1, 12]]), IndexError,
         "Index out of range: indices span [1, 12], but body.0 has num_embeddings=10 (valid 0..9)"),
        (nn.GRU(8, 4, batch_first=True), lambda: torch.randn(2, 3, 6), RuntimeError,
         "Feature mismatch: input has 6 features, but body.0 expects 8"),
    ],
    ids=["conv-channels", "layernorm", "batchnorm", "embedding-index", "gru"],
)
def test_layer_contracts_in_words(layer: nn.Module, batch: Callable[[], torch.Tensor], error: type, words: str) -> None:
    model = Wrap(layer)
    with torch_sentinel.attach(model, torch.optim.SGD(model.parameters(), lr=0.1)), pytest.raises(error) as info:
        model(batch())
    notes = _notes(info.value)
    assert len(notes) == 1 and words in notes[0]
    assert "produced by the model's input (the batch)" in notes[0]


def test_errors_that_are_not_about_shapes_get_no_note_and_no_finding() -> None:
    model = Raises()
    with torch_sentinel.attach(model, torch.optim.SGD(model.parameters(), lr=0.1)) as sentinel:
        with pytest.raises(ValueError, match="ran dry") as info:
            model(torch.randn(2, 4))
        assert _notes(info.value) == []
        assert sentinel.report().by_kind("shape_mismatch") == []


def test_contract_errors_inside_the_model_are_recorded_as_findings() -> None:
    model = EncoderDecoder()
    model.decoder = nn.Linear(32, 4)
    torch_sentinel.expect(model.decoder, input="B 16", name="decoder")
    with torch_sentinel.attach(model, torch.optim.SGD(model.parameters(), lr=0.1)) as sentinel:
        with pytest.raises(torch_sentinel.ShapeContractError, match="decoder violated") as info:
            model(torch.randn(8, 20))
        assert _notes(info.value) == []  # the contract's message already says it all
        assert [f.module for f in sentinel.report().by_kind("shape_mismatch")] == ["decoder"]


def test_detach_removes_the_note_hooks() -> None:
    model = EncoderDecoder()
    torch_sentinel.attach(model, torch.optim.SGD(model.parameters(), lr=0.1)).detach()
    assert all(not m._forward_hooks for m in model.modules())
    with pytest.raises(RuntimeError) as info:
        model(torch.randn(8, 20))
    assert _notes(info.value) == []


def test_healthy_training_and_eval_stay_quiet() -> None:
    model = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_sentinel.attach(model, opt) as sentinel:
        for _ in range(3):
            opt.zero_grad()
            nn.functional.cross_entropy(model(torch.randn(8, 20)), torch.randint(0, 4, (8,))).backward()
            opt.step()
        with torch.no_grad():
            model.eval()
            model(torch.randn(4, 20))
        assert sentinel.report().by_kind("shape_mismatch") == []
