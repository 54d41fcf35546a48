"""no_update: non-zero gradients but weights that do not move, persistently; warm-ups from lr 0,
frozen layers and decays to 0 stay quiet."""

from __future__ import annotations

import copy
import math
from typing import Any, Callable, Optional

import pytest
import torch
from torch import nn

import torch_sentinel


def _loop(model: nn.Module, opt: torch.optim.Optimizer, steps: int = 15,
          sched: Optional[torch.optim.lr_scheduler.LRScheduler] = None,
          before: Optional[Callable[[int], None]] = None, step: bool = True) -> torch_sentinel.Report:
    torch.manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for i in range(steps):
            if before is not None:
                before(i)
            opt.zero_grad()
            x = torch.randn(16, 6)
            nn.functional.mse_loss(model(x), x[:, :1]).backward()
            if step:
                opt.step()
            if sched is not None:
                sched.step()
        return s.report()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 1))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"], ids=["sgd", "adam"])
def test_lr_zero_is_reported_with_its_cause(optimizer: str) -> None:
    model = _model()
    cls = torch.optim.SGD if optimizer == "sgd" else torch.optim.Adam
    report = _loop(model, cls(model.parameters(), lr=0.0))
    (f,) = report.by_kind("no_update")
    assert f.module == "" and f.boundary == "updates" and "learning rate is 0" in f.message
    assert f.evidence["lrs"] == [0.0] and len(f.evidence["still_steps"]) >= 3
    assert report.next_check == "inspect_optimizer_update"


def test_weights_restored_between_steps() -> None:
    model = _model()
    saved = copy.deepcopy(model[2].state_dict())
    report = _loop(model, torch.optim.SGD(model.parameters(), lr=0.1),
                   before=lambda i: model[2].load_state_dict(saved))
    (f,) = report.by_kind("no_update")
    assert f.module == "2"  # only the restored layer stands still
    assert all(p.startswith("2.") for p in f.evidence["parameters"])


@pytest.mark.parametrize("warmup_zero_steps", [1, 2], ids=["one_still_step", "two_still_steps"])
def test_warmup_from_lr_zero_is_healthy(warmup_zero_steps: int) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.0 if s < warmup_zero_steps else min(1.0, s / 5))
    assert _loop(model, opt, sched=sched).by_kind("no_update") == []


def test_decay_to_zero_at_the_end_is_healthy() -> None:
    """A cosine schedule whose T_max is the run's last step reaches 0 exactly there: one still
    step, the schedule doing what it was asked to."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=14, eta_min=0.0)
    assert _loop(model, opt, sched=sched).by_kind("no_update") == []


_ZERO_PART_WAY = {
    # StepLR(gamma=0): "decay by 0" instead of by 0.1 at step 8
    "step_gamma_zero": lambda s: 1.0 if s < 8 else 0.0,
    # a timm-style cosine to min_lr=0 with t_initial=8 that then holds min_lr for the rest
    "cosine_ends_early": lambda s: 0.5 * (1 + math.cos(math.pi * min(s, 8) / 8)),
}


@pytest.mark.parametrize("schedule", list(_ZERO_PART_WAY), ids=list(_ZERO_PART_WAY))
def test_lr_falling_to_exactly_zero_part_way_is_reported(schedule: str) -> None:
    """Regression (issue 12): an lr of exactly 0 part-way was read as the tail of a decay."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _ZERO_PART_WAY[schedule])
    (f,) = _loop(model, opt, sched=sched).by_kind("no_update")
    assert f.evidence["lr_zero_since"] == 8 and f.onset_step == 8
    assert f.step is not None and f.step - 8 <= 20
    assert "fell to exactly 0 at step 8" in f.message


def test_optimizer_over_frozen_parameters_is_named() -> None:
    """Regression (issue 12): an optimizer whose parameters are all frozen was never named as
    the cause of a run that does not learn (the head it should train is outside it)."""
    model = _model()
    model[0].requires_grad_(False)
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)  # the bug: built over the frozen part
    report = _loop(model, opt)
    (f,) = [f for f in report.by_kind("no_update") if "requires_grad=False" in f.message]
    assert f.module == "0" and f.evidence["trainable_outside_optimizer"] == ["2.weight", "2.bias"]
    assert "zero_grad" not in " ".join(x.message for x in report.findings)


def test_frozen_parameters_are_never_flagged() -> None:
    model = _model()
    model[0].requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # frozen params sit in the optimizer too
    report = _loop(model, opt)
    assert report.by_kind("no_update") == [] and report.by_kind("no_gradient") == []


def test_step_never_called() -> None:
    model = _model()
    report = _loop(model, torch.optim.SGD(model.parameters(), lr=0.1), steps=5, step=False)
    (f,) = report.by_kind("no_update")
    assert f.evidence == {"backward_calls": 5, "optimizer_steps": 0}


def _dtype_run(dtype: torch.dtype, lr: float, mixed: bool) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, 4))
    (model[0] if mixed else model).to(dtype)  # mixed: only the first layer in that dtype
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(30):
            x = torch.randn(32, 16, generator=g).to(dtype)
            h = model[0](x).to(model[1].weight.dtype)
            out = model[3](model[2](model[1](h)))
            opt.zero_grad()
            nn.functional.cross_entropy(out.float(), x[:, :4].float().argmax(1)).backward()
            opt.step()
        return s.report()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64], ids=["bf16", "float64"])
@pytest.mark.parametrize("mixed", [False, True], ids=["whole_model", "mixed"])
@pytest.mark.parametrize("lr", [1e-2, 0.0], ids=["lr_1e-2", "lr_0"])
def test_no_update_in_other_dtypes(dtype: torch.dtype, mixed: bool, lr: float) -> None:
    """Regression (issue 12): bf16 weight norms (3 significant digits) stood still while the
    weights moved; norms are now accumulated in float32 or better, with the dtype's resolution
    in the threshold. A real lr of 0 is still found."""
    found = _dtype_run(dtype, lr, mixed).by_kind("no_update")
    assert bool(found) == (lr == 0.0), [str(f) for f in found]


def _before_layer_norm(restore_from: int | None, steps: int = 40) -> list[torch_sentinel.Finding]:
    """A Linear feeding a LayerNorm (its weight is scale-invariant), trained with plain SGD at
    a small lr: every step moves each weight, but the norm only at second order. With
    ``restore_from`` the first Linear's weights are put back after every step from then on."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.LayerNorm(256), nn.ReLU(), nn.Linear(256, 256),
                          nn.LayerNorm(256), nn.ReLU(), nn.Linear(256, 4))
    opt = torch.optim.SGD(model.parameters(), lr=3e-4)
    w = torch.randn(32, 4)
    with torch_sentinel.attach(model, opt) as s:
        for step in range(steps):
            x = torch.randn(64, 32)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x @ w).argmax(1)).backward()
            restore = restore_from is not None and step >= restore_from
            saved = [p.detach().clone() for p in model[0].parameters()] if restore else []
            opt.step()
            with torch.no_grad():
                for p, q in zip(model[0].parameters(), saved):
                    p.copy_(q)
        return s.report().findings


@pytest.mark.parametrize("restore_from", [None, 0, 15], ids=["healthy", "restored_from_step_0", "restored_from_step_15"])
def test_scale_invariant_weight_before_a_norm_layer(restore_from: int | None) -> None:
    """Regression (issue 12): a weight just before a LayerNorm whose L2 norm stands still (the
    SGD step is orthogonal to it) while its elements move was reported as no_update ("the
    weights were restored between steps"). A first-order fingerprint (float64 L1 norm) now
    confirms a still norm first; weights really put back after each step are still found."""
    findings = _before_layer_norm(restore_from)
    if restore_from is None:
        assert findings == []
        return
    (f,) = [f for f in findings if f.kind == "no_update"]
    assert f.module == "0" and set(f.evidence["parameters"]) <= {"0.weight", "0.bias"}
    # onset: the first step a fingerprint confirmed (CPU reads the weights on steps 0-9, then on
    # pairs of steps every ten: 20-21 is the first pair after step 15)
    assert f.onset_step == (0 if restore_from == 0 else 20)
    assert f.step is not None and f.step - restore_from <= 20
    assert "the weights were restored between steps" in f.message


def test_fingerprints_failing_falls_back_to_the_norm_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """Never the reason training stops: a device or dtype without a float64 L1 norm switches
    the fingerprints off with one warning; a still weight is then judged by its L2 norm alone."""
    real = torch._foreach_norm

    def refuse_float64(tensors: Any, ord: Any = 2, dtype: Any = None) -> Any:
        if dtype is torch.float64:
            raise RuntimeError("no float64 here")
        return real(tensors, ord, dtype=dtype) if dtype is not None else real(tensors, ord)

    monkeypatch.setattr(torch, "_foreach_norm", refuse_float64)
    with pytest.warns(RuntimeWarning, match="first-order weight fingerprints are not taken") as caught:
        findings = _before_layer_norm(0, steps=12)
    assert len([w for w in caught if "fingerprints" in str(w.message)]) == 1
    (f,) = [f for f in findings if f.kind == "no_update"]
    assert f.module == "0" and f.onset_step == 0


def test_batchnorm_weight_whose_gradient_sums_to_zero_is_not_still() -> None:
    """Regression: in a 20-block Linear/BatchNorm/ReLU MLP, a BatchNorm weight (all ones, with
    another BatchNorm after it) gets a gradient that sums to ~0, so its L2 norm and its L1
    fingerprint (``sum sign(w) dw``) were both bit-identical on 8% of the SGD steps although
    every element moved; three such observed pairs made a no_update error on '16'. The largest
    magnitude is now fingerprinted too."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(20):
        layers += [nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU()]
    model = nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64)
    weight = model[16].weight
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(30):
            before = weight.detach().clone()
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            assert not torch.equal(weight.detach(), before)  # it moves at every step
        assert s.report().by_kind("no_update") == []


def _classifier_run(clear: str, steps: int = 12) -> torch_sentinel.Report:
    """A classifier whose gradients are cleared between backward and step, by a zero_grad() in
    place or by a clip to 0 (``clear``), or not at all (``none``)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(steps):
            x = torch.randn(32, 10)
            opt.zero_grad(set_to_none=False)
            nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
            if clear == "zero_grad":
                opt.zero_grad(set_to_none=False)
            elif clear == "clip":
                nn.utils.clip_grad_norm_(model.parameters(), 0.0)
            opt.step()
        return s.report()


@pytest.mark.parametrize(("clear", "words"), [("zero_grad", "a zero_grad() cleared every gradient"),
                                              ("clip", "multiplied every gradient by 0"), ("none", None)],
                         ids=["zero_grad_in_place", "clip_to_zero", "healthy"])
def test_gradients_cleared_between_backward_and_step_in_place(clear: str, words: Optional[str]) -> None:
    """Zero tensors, not None: the call that cleared them is the evidence (issue 25)."""
    found = _classifier_run(clear).by_kind("no_update")
    if words is None:
        assert found == []
        return
    (f,) = found
    assert words in f.message and f.module == "" and f.onset_step == 0 and f.severity == "error"
    assert f.evidence["cleared_by"] == clear


def test_lr_at_zero_for_a_stretch_is_described_as_seen() -> None:
    """A learning rate at exactly 0 from step 10 that rises again at step 20 (a cosine stepped past
    T_max): the finding says from when to when it was 0, never that nothing can move any more."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with torch_sentinel.attach(model, opt) as s:
        for step in range(30):
            for g in opt.param_groups:
                g["lr"] = 0.0 if 10 <= step < 20 else 0.05
            x = torch.randn(16, 10)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
            opt.step()
        (f,) = s.report().by_kind("no_update")
    assert f.onset_step == 10 and "any more" not in f.message
    assert "from 10 through 19" in f.message and f.evidence["lr_zero_through"] == 19


def test_a_converged_full_batch_fit_is_info() -> None:
    """L-BFGS on a full batch converges and then declines to move at its own tolerance: the weights
    and the loss stand still to the last bit, far below the start."""
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 64).unsqueeze(1)
    y = torch.sin(2 * x)
    model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=20, history_size=20)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    with torch_sentinel.attach(model, opt) as s:
        for _ in range(60):
            opt.step(closure)
        report = s.report()
    assert report.ok, [str(f) for f in report.findings]
    for f in report.by_kind("no_update"):
        assert f.severity == "info" and f.evidence["converged"]
