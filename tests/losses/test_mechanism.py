"""The loss contracts' machinery: no host reads, scoping to the model, patches next to another
library's, and the judge's rules on synthetic figures."""

from __future__ import annotations

import functools
import warnings
from typing import Any, Optional

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import torch_sentinel
from torch_sentinel import Detector, StepRecord
from torch_sentinel._collect.loss_inputs import LossCalls, LossFigures
from torch_sentinel.losses import checks
from torch_sentinel.losses.calls import LossCall, describe
from torch_sentinel.losses.contracts import by_function
from torch_sentinel.losses.verdicts import ContractJudge, Limits
from torch_sentinel.testing import count_host_syncs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- no host reads ------------------------------------------------------------------------------
class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.cls = nn.Linear(16, 5)
        self.frames = nn.Linear(16, 6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.body(x))
        return self.cls(h), self.frames(h)


def _many_losses(model: TwoHeads, opt: torch.optim.Optimizer, steps: int) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randn(12, 8, generator=g)
        y = torch.randint(0, 5, (12,), generator=g)
        logits, frames = model(x)
        teacher = torch.softmax(torch.randn(12, 5, generator=g), 1)
        targets = torch.randint(1, 6, (3, 2), generator=g)
        opt.zero_grad()
        loss = (F.nll_loss(F.log_softmax(logits, 1), y) + F.kl_div(F.log_softmax(logits, 1), teacher, reduction="batchmean")
                + F.binary_cross_entropy_with_logits(logits, (teacher > 0.2).float())
                + F.ctc_loss(frames.reshape(4, 3, 6).log_softmax(2), targets, (4, 4, 4), (2, 1, 2))
                + F.multilabel_margin_loss(logits, torch.tensor([[0, 2, -1, 0, 0]] * 12))
                + F.margin_ranking_loss(logits[:, 0], logits[:, 1], torch.sign(y.float() - 2) + (y == 2).float())
                + F.mse_loss(logits[:, :1], x[:, :1]))
        loss.backward()
        opt.step()


class SeenLosses(Detector):
    """Reads the loss calls' facts, as any detector may: which losses were judged, with figures."""

    kind = "seen_losses_test"
    rung = "loss"
    reads = (LossCalls, LossFigures)

    def setup(self) -> None:
        self.losses: set[str] = set()
        self.measured: set[str] = set()

    def update(self, record: StepRecord) -> None:
        calls, figures = record.fact(LossCalls), record.fact(LossFigures)
        for call in calls.calls if calls is not None else ():
            self.losses.add(call.loss)
            if figures is not None and any(v is not None for v in figures.of(call.block).values()):
                self.measured.add(call.loss)


@pytest.mark.parametrize("check", ["immediate", "deferred"])
def test_sampled_loss_checks_add_no_host_reads(check: str) -> None:
    """Steps 0-11 hold 6 sampled steps, each checking seven losses' clauses on the device."""
    torch.manual_seed(0)
    model = TwoHeads()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with count_host_syncs() as bare:
        _many_losses(model, opt, 12)
    seen = SeenLosses()
    with torch_sentinel.attach(model, opt, check=check, flush_every=1000, detectors=[seen]), \
            count_host_syncs() as attached:
        _many_losses(model, opt, 12)
    assert attached.count == bare.count, dict(attached.ops)
    assert seen.losses == {"nll_loss", "kl_div", "binary_cross_entropy_with_logits", "ctc_loss",
                           "multilabel_margin_loss", "margin_ranking_loss", "mse_loss"}
    assert seen.measured == seen.losses - {"mse_loss"}  # MSE's one clause is a host fact


# -- scoping ------------------------------------------------------------------------------------
def test_a_gan_target_fault_is_charged_to_the_network_whose_loss_it_is() -> None:
    """The discriminator's real labels are stored 0-255: only its sentinel says so. The
    generator's loss reads the discriminator's output of G(z): it reaches both networks, and its
    targets are fine."""
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 6), nn.Tanh())
    D = nn.Sequential(nn.Linear(6, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    opt_g, opt_d = torch.optim.Adam(G.parameters(), 1e-3), torch.optim.Adam(D.parameters(), 1e-3)
    sg, sd = torch_sentinel.attach(G, opt_g), torch_sentinel.attach(D, opt_d)
    bce = nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        real, z = torch.randn(16, 6, generator=g), torch.randn(16, 4, generator=g)
        opt_d.zero_grad()
        err_d = bce(D(real), torch.full((16, 1), 255.0)) + bce(D(G(z).detach()), torch.zeros(16, 1))
        err_d.backward()
        opt_d.step()
        opt_g.zero_grad()
        bce(D(G(z)), torch.ones(16, 1)).backward()
        opt_g.step()
    on_d = [f for f in sd.report().findings if f.kind == "invalid_target"]
    on_g = [f for f in sg.report().findings if f.kind == "invalid_target"]
    sg.detach()
    sd.detach()
    assert len(on_d) == 1 and on_d[0].evidence["target_max"] == 255.0
    assert on_g == []


def test_a_loss_of_another_tensor_in_the_loop_is_not_the_models() -> None:
    """A second loss on tensors the model never made (an auxiliary model's own head, not
    attached) is not this model's: its broken targets are not reported here."""
    torch.manual_seed(0)
    model, aux = nn.Linear(8, 1), nn.Linear(8, 1)
    opt = torch.optim.SGD([*model.parameters(), *aux.parameters()], lr=0.01)
    with torch_sentinel.attach(model, opt) as s:
        g = torch.Generator().manual_seed(0)
        for _ in range(12):
            x = torch.randn(16, 8, generator=g)
            opt.zero_grad()
            ok = F.binary_cross_entropy_with_logits(model(x), (x[:, :1] > 0).float())
            other = F.binary_cross_entropy_with_logits(aux(x), (x[:, :1] > 0).float() * 255)
            (ok + other).backward()
            opt.step()
        assert s.report().by_kind("invalid_target") == []


# -- patches next to another library's ----------------------------------------------------------
def _their_wrapper(fn: Any, calls: list[int]) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return fn(*args, **kwargs)

    return wrapper


def _train_nll_on_logits(steps: int = 8) -> list[Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 5))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torch_sentinel.attach(model, opt) as s:
        g = torch.Generator().manual_seed(0)
        for _ in range(steps):
            opt.zero_grad()
            F.nll_loss(model(torch.randn(16, 8, generator=g)), torch.randint(0, 5, (16,), generator=g)).backward()
            opt.step()
        return s.report().by_kind("invalid_loss_input")


@pytest.mark.parametrize("order", ["theirs-first", "ours-first", "theirs-restores-its-saved-original"])
def test_another_library_patching_the_same_loss_loses_nothing(order: str, monkeypatch: pytest.MonkeyPatch) -> None:
    original = F.nll_loss
    calls: list[int] = []
    if order == "theirs-first":
        monkeypatch.setattr(F, "nll_loss", _their_wrapper(original, calls))
        found = _train_nll_on_logits()
        assert F.nll_loss is not original and F.nll_loss.__wrapped__ is original  # theirs, back in place
    else:
        model = nn.Linear(8, 5)
        first = torch_sentinel.attach(model)  # holds our wrapper for the whole test
        ours = F.nll_loss
        if order == "ours-first":
            monkeypatch.setattr(F, "nll_loss", _their_wrapper(ours, calls))
        else:  # a library that saved F.nll_loss before us puts its copy back: ensure() re-wraps
            monkeypatch.setattr(F, "nll_loss", _their_wrapper(original, calls))
        found = _train_nll_on_logits()
        first.detach()
    assert len(found) == 1 and found[0].evidence["clause"] == "log_probabilities"
    assert len(calls) == 8  # their wrapper saw every call


# -- the parts, on synthetic inputs ---------------------------------------------------------------
def _call(loss: str, **facts: Any) -> LossCall:
    base: dict[str, Any] = dict(step=0, loss=loss, site="train.py:1", block="b", input_shape=(8, 5),
                                target_shape=(8,), input_dtype="float32", target_kind="indices", class_dim=1,
                                target_dim=None, dim_known=True, producer="linear", producer_dim=None,
                                producer_linear=True, options=(), broadcast_shape=None, module=None, measured=())
    base.update(facts)
    return LossCall(**base)


NLL_LOGITS = {"x_min": -3.0, "x_max": 4.0, "x_sum_dev_max": 6.0, "x_lse_lo": 2.5, "x_lse_hi": 4.1, "x_lse_off": 1.0}
NLL_PROBS = {"x_min": 0.01, "x_max": 0.9, "x_sum_dev_max": 1e-7, "x_lse_lo": 1.7, "x_lse_hi": 1.9, "x_lse_off": 1.0}
NLL_LOGPROBS = {"x_min": -6.0, "x_max": -0.1, "x_sum_dev_max": 0.9, "x_lse_lo": -1e-7, "x_lse_hi": 1e-7, "x_lse_off": 0.0}

JUDGE_CASES: dict[str, tuple[str, list[dict[str, Optional[float]]], dict[str, Any], Optional[tuple[str, str, int]]]] = {
    "nll-logits-3-probes": ("nll_loss", [NLL_LOGITS] * 3, {}, ("log_probabilities", "warning", 2)),
    "nll-logits-2-probes": ("nll_loss", [NLL_LOGITS] * 2, {}, None),
    "nll-logits-intermittent": ("nll_loss", [NLL_LOGITS, NLL_LOGPROBS] * 3 + [NLL_LOGPROBS] * 2, {}, None),
    "nll-probabilities-named-first": ("nll_loss", [NLL_PROBS] * 3, {}, ("probabilities_as_logits", "warning", 2)),
    "nll-healthy": ("nll_loss", [NLL_LOGPROBS] * 5, {}, None),
    "nll-some-rows-off-is-info": ("nll_loss", [{**NLL_LOGITS, "x_lse_off": 0.6}] * 3, {},
                                  ("log_probabilities", "info", 2)),
    "nll-log-softmax-over-dim-2": ("nll_loss", [NLL_LOGITS], {"input_shape": (8, 6, 6), "producer": "log_softmax",
                                                             "producer_dim": 2, "producer_linear": False},
                                   ("class_dim", "warning", 0)),
    "bcel-unit-interval-without-sigmoid": ("binary_cross_entropy_with_logits",
                                           [{"x_min": 0.05, "x_max": 0.3, "t_min": 0.0, "t_max": 1.0}] * 5,
                                           {"class_dim": None}, None),
    "bcel-sigmoid": ("binary_cross_entropy_with_logits", [{"x_min": 0.05, "x_max": 0.9, "t_min": 0.0, "t_max": 1.0}] * 3,
                     {"class_dim": None, "producer": "sigmoid"}, ("probabilities_as_logits", "warning", 2)),
    "bcel-255": ("binary_cross_entropy_with_logits", [{"x_min": -2.0, "x_max": 2.0, "t_min": 0.0, "t_max": 255.0}] * 3,
                 {"class_dim": None}, ("target_range", "warning", 2)),
    "kl-rows-over-a-guessed-dim": ("kl_div", [{"x_min": -5.0, "x_max": -0.1, "x_lse_off": 0.0, "t_min": 0.0,
                                               "t_max": 0.9, "t_sum_off": 1.0}] * 3,
                                   {"class_dim": None, "target_dim": 3, "dim_known": False, "input_shape": (2, 3, 4, 5)},
                                   ("target_probabilities", "info", 2)),
    "nan-figures-are-not-evidence": ("nll_loss", [dict.fromkeys(NLL_LOGITS, float("nan"))] * 5, {}, None),
}


@pytest.mark.parametrize("name", list(JUDGE_CASES), ids=list(JUDGE_CASES))
def test_judge(name: str) -> None:
    loss, figures, facts, expected = JUDGE_CASES[name]
    judge = ContractJudge(Limits())
    for step, f in enumerate(figures):
        judge.update(_call(loss, step=step, **facts), f)
    verdicts = judge.conclude()
    if expected is None:
        assert verdicts == []
        return
    (v,) = verdicts
    assert (v.clause, v.severity, v.step) == expected
    assert v.evidence["clause"] == expected[0] and v.evidence["site"] == "train.py:1" and "train.py:1" in v.message
    assert judge.conclude() == []  # given once


def test_describe_reads_the_producer_and_the_class_dim() -> None:
    lin = nn.Linear(16, 6)
    h = torch.randn(4, 6, 16)
    nll = by_function("nll_loss")
    assert nll is not None
    d = describe(nll, F.nll_loss, (F.log_softmax(lin(h), dim=-1), torch.zeros(4, 6, dtype=torch.long)), {})
    assert d is not None
    assert (d.facts["producer"], d.facts["producer_dim"], d.facts["class_dim"]) == ("log_softmax", 2, 1)
    d = describe(nll, F.nll_loss, (lin(h), torch.zeros(4, 6, dtype=torch.long)), {"reduction": "sum"})
    assert d is not None and d.facts["producer_linear"] and ("reduction", "sum") in d.facts["options"]
    bcel = by_function("binary_cross_entropy_with_logits")
    assert bcel is not None
    d = describe(bcel, F.binary_cross_entropy_with_logits, (torch.sigmoid(lin(h)).view(-1), torch.rand(4 * 6 * 6)), {})
    assert d is not None and d.facts["producer"] == "sigmoid" and not d.facts["producer_linear"]
    assert describe(nll, F.nll_loss, (torch.randn(4, 6), torch.zeros(4, dtype=torch.long)), {}) is None  # no grad


def test_checks_read_a_bounded_slice_of_large_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checks, "ROW_ELEMENTS", 1000)
    x = torch.randn(64, 100)
    x[10:] = 50.0  # rows past the slice would change every figure
    r = checks.rows(x, 1)
    assert r.shape == (10, 100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = checks.log_probabilities(checks.rows(torch.randn(2, 7, 3, 3).log_softmax(1), 1), 1e-3)
    assert float(got["lse_off"]) == 0.0 and abs(float(got["lse_lo"])) < 1e-5
