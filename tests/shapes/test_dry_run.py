"""check_shapes: a per-module table from the meta device; the first mismatch stops it with a note."""

from __future__ import annotations

import pytest
import torch
from helpers import MODELS, make_batch
from torch import nn

import torch_sentinel


class Positional(nn.Module):
    """Creates a tensor inside forward (torch.arange), which must land on meta too."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 4)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1]).float()[:, None]
        return self.head(self.norm(self.embed(tokens) + pos))


@pytest.mark.parametrize("kind", ["mlp", "cnn", "transformer"], ids=["mlp", "cnn", "transformer"])
def test_table_has_every_called_module_and_leaves_the_model_untouched(kind: str) -> None:
    torch.manual_seed(0)
    model = MODELS[kind]()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, _ = make_batch(kind, n=6)
    table = torch_sentinel.check_shapes(model, x)
    assert table.rows[0].module == "" and table.rows[0].outputs == [(6, 4)]
    assert table["head"].inputs[0][0] == 6 and table["head"].outputs == [(6, 4)]
    assert {r.module for r in table.rows} >= {n for n, m in model.named_modules() if not list(m.children())} - {""} - {
        n for n, _ in model.named_modules() if "dropout" in n or n.endswith("self_attn.out_proj")}
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # BatchNorm stats untouched
    assert all(p.device.type == "cpu" for p in model.parameters())
    text = str(table)
    assert text.splitlines()[0].split() == ["module", "inputs", "outputs"]
    assert "head (Linear)" in text and "(6, 4)" in text


def test_tensors_created_in_forward_follow_to_meta() -> None:
    table = torch_sentinel.check_shapes(Positional(), torch.zeros(2, 7, dtype=torch.long))
    assert table["norm"].inputs == [(2, 7, 16)]
    assert table[""].outputs == [(2, 7, 4)]


def test_first_mismatch_stops_with_the_note_and_the_rows_so_far() -> None:
    model = nn.Sequential()
    model.add_module("encoder", nn.Linear(20, 32))
    model.add_module("act", nn.ReLU())
    model.add_module("decoder", nn.Linear(16, 4))
    model.add_module("out", nn.Softmax(-1))
    with pytest.raises(RuntimeError) as info:
        torch_sentinel.check_shapes(model, torch.randn(8, 20))
    notes = "\n".join(info.value.__notes__)
    assert "shape mismatch in module 'decoder' (Linear)" in notes
    assert "Feature mismatch: input has 32 features, but decoder expects 16" in notes
    assert "produced by module 'act' (ReLU)" in notes
    assert "dry-run shapes so far" in notes and "encoder (Linear)" in notes
    assert "out (Softmax)" not in notes  # it stopped at the first mismatch
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_bad_model_argument() -> None:
    with pytest.raises(TypeError, match=r"expected an nn\.Module"):
        torch_sentinel.check_shapes(lambda x: x, torch.zeros(1))  # type: ignore[arg-type]
