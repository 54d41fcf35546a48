"""update_ratio: ||dW|| / ||W|| far above ~1e-3 on the sampled steps."""

from __future__ import annotations

import math
from typing import Optional

import pytest
import torch
from torch import nn

import torch_sentinel


@pytest.mark.parametrize(("lr", "fires"), [(1e-3, False), (1.0, True)], ids=["adam_1e-3", "adam_1.0"])
def test_update_ratio(lr: float, fires: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    with torch_sentinel.attach(model, opt, update_every=2) as s:
        for _ in range(8):
            x = torch.randn(16, 16)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
            opt.step()
        hits = s.report().by_kind("update_ratio")
    assert bool(hits) is fires
    if fires:
        ev = hits[0].evidence
        assert ev["ratio"] > 0.1 and ev["largest_param"].endswith("weight")
        # The weight norms before every step bound the ratio from below (steps 0, 1, 2) unless
        # the weights have grown tenfold by then; the third sampled step (0, 2, 4) proves it too.
        assert ev["steps"] in ([0, 1, 2], [0, 2, 4])


def _warmup_run(peak_lr: float, steps: int = 30) -> list[torch_sentinel.Finding]:
    """A small pre-norm transformer-style MLP trained the nanoGPT way: AdamW, init N(0, 0.02),
    4 warm-up steps, cosine decay, clipping at 1.0."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(16, 32), nn.LayerNorm(32), nn.Linear(32, 128), nn.GELU(),
                          nn.Linear(128, 32), nn.LayerNorm(32), nn.Linear(32, 16))
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    table = torch.randperm(16, generator=torch.Generator().manual_seed(1))
    with torch_sentinel.attach(model, opt) as s:
        for it in range(steps):
            for group in opt.param_groups:
                group["lr"] = peak_lr * (it + 1) / 5 if it < 4 else peak_lr * (0.55 + 0.45 * math.cos(math.pi * (it - 4) / steps))
            x = torch.randint(0, 16, (64,))
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), table[x]).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        return s.report().findings


@pytest.mark.parametrize(("peak_lr", "severity"), [(3e-3, None), (0.3, "info")],
                         ids=["lr_3e-3", "lr_x100"])
def test_lr_too_high_during_warm_up_is_found_between_samples(peak_lr: float, severity: Optional[str]) -> None:
    """Regression (issue 12, realworld nanogpt/lr_x100): an lr far too high blows the weights
    up during the warm-up, after which Adam's weights have grown to match it and the ratio
    sampled every 10 steps (0, 10, 20) looks ordinary. The weight norms read before every step
    bound the ratio from below and find it within the warm-up.

    Whether that is a warning is the loss history's to say (issue 25): at lr 0.3 the loss falls
    from 2.8 to 5e-4 in 30 steps (torch 2.13), so "too high" is contradicted and the finding is
    info. (Before issue 25 this test expected a
    warning at 0.3, from a docstring saying "the loss then sits at chance"; the run says otherwise.)"""
    findings = _warmup_run(peak_lr)
    hits = [f for f in findings if f.kind == "update_ratio"]
    if severity is None:
        assert findings == []
        return
    (f,) = hits
    assert f.severity == severity and [g for g in findings if g.is_fault] == ([f] if severity == "warning" else [])
    assert f.onset_step == 0 and f.step is not None and f.step <= 20
    assert f.evidence["ratio_at_least"] > 0.1 and f.next_check == "lower_learning_rate"
    assert "was at least" in f.message
    if severity == "warning":
        assert "the learning rate is likely too high" in f.message and "rose" in f.message
    else:
        assert "does not say the learning rate is too high" in f.message and "improved fast" in f.message


@pytest.mark.parametrize(("init", "optimizer", "lr"),
                         [("zeros", "sgd", 0.1), ("zeros", "adam", 1e-2), ("tiny", "adam", 1e-3)],
                         ids=["zeros_sgd_0.1", "zeros_adam_1e-2", "normal_1e-4_adam_1e-3"])
def test_weights_growing_from_nothing_are_not_a_high_ratio(init: str, optimizer: str, lr: float) -> None:
    """A logistic regression from zero (or tiny) weights grows by large relative steps at any
    lr: the lower bound read from the weight norms is not evidence there (it was a false
    alarm: "changed by 74%, 45%, 23% of itself")."""
    torch.manual_seed(0)
    model = nn.Linear(20, 3)
    if init == "zeros":
        nn.init.zeros_(model.weight)
    else:
        nn.init.normal_(model.weight, 0.0, 1e-4)
    nn.init.zeros_(model.bias)
    opt = (torch.optim.SGD if optimizer == "sgd" else torch.optim.Adam)(model.parameters(), lr=lr)
    w = torch.randn(20, 3)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(30):
            x = torch.randn(64, 20)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x @ w).argmax(1)).backward()
            opt.step()
        assert s.report().findings == []


class _WithIntegerOutputs(nn.Module):
    """Returns logits beside integer tensors (predicted classes, a per-row count), as detection
    and tagging heads do; the integer outputs have no gradient and no module to update."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.body(x)
        return {"logits": logits, "pred": logits.argmax(1), "positives": (x > 0).sum(1, dtype=torch.int32)}


@pytest.mark.parametrize("check", ["immediate", "deferred"], ids=["immediate", "deferred"])
@pytest.mark.parametrize(("lr", "fires"), [(1e-3, False), (3e-2, False), (1.0, True)],
                         ids=["adam_1e-3", "adam_3e-2", "adam_1.0"])
def test_integer_outputs_leave_update_ratio_to_the_weights(check: str, lr: float, fires: bool) -> None:
    """Issue 22, edge case: a model with integer tensor outputs got a false ``update_ratio``.
    Not reproduced here (72 configurations); pinned so that it stays absent, next to a run of
    the same model whose lr is far too high, which must still be found."""
    torch.manual_seed(0)
    model = _WithIntegerOutputs()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(0)
    with torch_sentinel.attach(model, opt, check=check) as s:
        for _ in range(60):
            x = torch.randn(32, 16, generator=g)
            opt.zero_grad()
            out = model(x)
            nn.functional.cross_entropy(out["logits"], (x[:, 0] > 0).long()).backward()
            opt.step()
        report = s.report()
    ratio = [f for f in report.by_kind("update_ratio") if f.severity != "info"]
    assert bool(ratio) is fires, [str(f) for f in report.findings]
    if not fires:
        assert [f for f in report.findings if f.severity != "info"] == []
