"""exploding_gradient / vanishing_gradient: per-layer gradients across depth."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torch_sentinel


def _deep(act: type[nn.Module], std: float | None) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(16, 16), act()]
    model = nn.Sequential(*layers, nn.Linear(16, 1))
    if std is not None:
        for m in model.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, std)
    return model


CASES = {
    "sigmoid_vanishes": (nn.Sigmoid, None, "vanishing_gradient"),
    "std1_init_explodes": (nn.ReLU, 1.0, "exploding_gradient"),
    "default_relu_is_quiet": (nn.ReLU, None, None),
    "default_tanh_is_quiet": (nn.Tanh, None, None),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_gradient_scale_across_depth(case: str) -> None:
    act, std, kind = CASES[case]
    model = _deep(act, std)
    opt = torch.optim.SGD(model.parameters(), lr=1e-9)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(8):
            opt.zero_grad()
            model(torch.randn(32, 16)).pow(2).mean().backward()
            opt.step()
        report = s.report()
    found = report.kinds() & {"vanishing_gradient", "exploding_gradient"}
    assert found == ({kind} if kind else set())
    if kind:
        f = report.by_kind(kind)[0]
        assert f.module == "0" and f.evidence["last_layer"] == "16"
        assert (f.evidence["ratio"] < 1e-3) if kind == "vanishing_gradient" else (f.evidence["ratio"] > 70)


def test_threshold_override() -> None:
    model = _deep(nn.Sigmoid, None)
    opt = torch.optim.SGD(model.parameters(), lr=1e-9)
    with torch_sentinel.attach(model, opt, thresholds={"vanishing_gradient.ratio": 1e-12}) as s:
        for _ in range(8):
            opt.zero_grad()
            model(torch.randn(32, 16)).pow(2).mean().backward()
            opt.step()
        assert s.report().by_kind("vanishing_gradient") == []


def _bert_from_scratch() -> torch_sentinel.Report:
    """A small BERT built from a config (no download), trained from scratch at a brisk lr; its
    first Linear in forward order is layer 0's attention query projection."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    model = transformers.BertForSequenceClassification(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(40):
            ids = torch.randint(0, 64, (16, 12), generator=g)
            opt.zero_grad()
            model(input_ids=ids, labels=(ids[:, 0] < 32).long()).loss.backward()
            opt.step()
        return s.report()


def test_transformer_from_scratch_query_projection_is_not_a_vanishing_gradient() -> None:
    """Regression (issue 12): depth came from forward order of Linear layers, so the attention
    query projection (tiny gradient by construction beside the value projection at the same
    graph depth) was "the first layer" and vanishing_gradient fired on a healthy run."""
    assert _bert_from_scratch().by_kind("vanishing_gradient") == []


def _tanh_stack(modules: int, gain: float) -> nn.Sequential:
    """Alternating Linear(64, 64) / Tanh, xavier-normal weights with ``gain``."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(64, 64) if i % 2 == 0 else nn.Tanh() for i in range(modules)])
    for m in model:
        if isinstance(m, nn.Linear):
            nn.init.xavier_normal_(m.weight, gain=gain)
    return model


def _exploding(model: nn.Module, steps: int = 12) -> list[torch_sentinel.Finding]:
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x, y = torch.randn(32, 64), torch.randn(32, 64)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(steps):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        return s.report().by_kind("exploding_gradient")


def test_deep_tanh_stack_with_the_standard_gain_is_not_an_explosion() -> None:
    """Regression: a healthy 100-module Linear/Tanh stack (PyTorch's tanh gain 5/3) raised
    exploding_gradient: its backpropagated signal grows 1.10x per layer, which compounds to
    ~80x over 50 layers, above the 70x ratio meant for shallow models. It trains normally
    (even at lr 1e-2), so the ratio must also mean a steep growth per layer."""
    assert _exploding(_tanh_stack(100, 5 / 3)) == []


def test_deep_tanh_stack_with_a_steep_growth_per_layer_still_explodes() -> None:
    """The true positive the per-layer rule keeps: gain 2.5 grows the signal ~1.25x per layer
    (ratio ~1e5 over 50 layers); with it the first layer's weights grow and the loss climbs
    back up within 100 steps at lr 1e-4."""
    found = _exploding(_tanh_stack(100, 2.5))
    assert [f.module for f in found] == ["0"]
    ev = found[0].evidence
    assert ev["layers"] == 50 and ev["per_layer_growth"] > 1.15 and ev["ratio"] > 1.15 ** 49


@pytest.mark.parametrize(("optimizer", "severity"), [("sgd", "warning"), ("adam", "info")], ids=["sgd", "adam"])
def test_vanishing_needs_the_first_layers_to_lag_in_their_updates(optimizer: str, severity: str) -> None:
    """Issue 25: the same deep sigmoid stack has the same vanishing gradients under SGD and under
    Adam, but only SGD's first layers lag in their updates (Adam scales each update to its own
    gradient, as the HF Trainer's AdamW does for a BERT fine-tune): a warning under SGD, info
    under Adam, saying the first layers do not lag."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(10):
        layers += [nn.Linear(16, 16), nn.Sigmoid()]
    model = nn.Sequential(*layers, nn.Linear(16, 2))
    opt = (torch.optim.SGD(model.parameters(), lr=0.01) if optimizer == "sgd"
           else torch.optim.Adam(model.parameters(), lr=1e-4))
    with torch_sentinel.attach(model, opt, update_every=2) as s:
        for _ in range(12):
            x = torch.randn(32, 16)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
            opt.step()
        (f,) = s.report().by_kind("vanishing_gradient")
    assert f.severity == severity and f.module == "0"
    lag = f.evidence["update_lag"]
    assert (lag < 1e-2) if severity == "warning" else (lag > 1e-2 and "do not lag" in f.message)
