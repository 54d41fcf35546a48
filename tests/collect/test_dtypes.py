"""Every dtype at its own width: a value is non-finite only if it is NaN or Inf in its own dtype.

float64 models whose values are finite but beyond float32's range (about 3.4e38) train quietly
in both check modes; a real NaN or Inf in the same models is caught at its exact step and
module, and a NonFiniteError always names the NaN/Inf counts (or kinds) it found. fp16 and bf16
keep working; float8 tensors are watched where torch can reduce them, and otherwise skipped by
the probe with one warning that says what is not watched, never a crash.
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from typing import Callable, Optional

import pytest
import torch
from torch import nn

import torch_sentinel
from torch_sentinel import NonFiniteError

F32_MAX = float(torch.finfo(torch.float32).max)


class Units(nn.Module):
    """Converts a dimensionless quantity to physical units, as physics-informed models do."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


@dataclasses.dataclass
class Case:
    """A float64 model whose values at one boundary are finite but beyond float32's range."""

    build: Callable[[], nn.Module]
    lr: float
    batch: Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    #: The boundary whose values exceed float32 (checked by hand in the test).
    beyond: str


def _mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out, y)


def _sq_mean(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (out**2).mean()


def _normal(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(8, 4, generator=g, dtype=torch.float64), torch.randn(8, 1, generator=g, dtype=torch.float64)


def _huge_inputs(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = _normal(g)
    return x * 1e20, y


def _loss_model() -> nn.Module:
    # The issue's reproduction: an unscaled float64 regression, loss ~1e40, gradients ~1e40.
    return nn.Linear(4, 1).double()


def _activations_model() -> nn.Module:
    # An activation of ~1e40 (module '2'), read out by a layer in matching units; its weight
    # gradient is ~1e40 too.
    m = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), Units(1e40), nn.Linear(16, 1)).double()
    with torch.no_grad():
        m[3].weight.mul_(1e-40)
    return m


def _gradients_model() -> nn.Module:
    # A layer working in tiny units: the gradient flowing into its output and its weight
    # gradient are ~1e40 (and their L2 norms beyond float32), values elsewhere are ordinary.
    m = nn.Sequential(nn.Linear(4, 16), Units(1e40), nn.Tanh(), nn.Linear(16, 1)).double()
    with torch.no_grad():
        m[0].weight.mul_(1e-40)
        m[0].bias.mul_(1e-40)
    return m


def _weights_model() -> nn.Module:
    # A weight of ~1e39 per element (its norm and its layer's output beyond float32).
    m = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1), Units(1e-39)).double()
    with torch.no_grad():
        m[2].weight.mul_(1e39)
    return m


CASES = {
    "loss": Case(_loss_model, 1e-50, _huge_inputs, _sq_mean, "loss"),
    "activations": Case(_activations_model, 1e-81, _normal, _mse, "forward"),
    "gradients": Case(_gradients_model, 1e-81, _normal, _mse, "gradients"),
    "weight_norms": Case(_weights_model, 1e-3, _normal, _mse, "updates"),
}


def _train(
    sentinel: Optional[torch_sentinel.Sentinel],
    model: nn.Module,
    opt: torch.optim.Optimizer,
    case: Case,
    steps: int,
    *,
    corrupt_loss_at: Optional[int] = None,
    before_step: Optional[Callable[[int], None]] = None,
    observe: bool = False,
) -> list[float]:
    """The user's loop; returns the float64 losses it computed."""
    g = torch.Generator().manual_seed(0)
    losses = []
    for step in range(steps):
        x, y = case.batch(g)
        if before_step is not None:
            before_step(step)
        opt.zero_grad()
        loss = case.loss(model(x), y)
        if corrupt_loss_at == step:
            loss = loss * math.nan
        if observe and sentinel is not None:
            sentinel.observe_loss(loss)
            sentinel.observe_validation(loss.detach() * 2)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _caught(sentinel: torch_sentinel.Sentinel, loop: Callable[[], object]) -> Optional[NonFiniteError]:
    try:
        loop()
        sentinel.detach()
    except NonFiniteError as e:
        return e
    finally:
        sentinel.detach()
    return None


def _beyond_float32_by_hand(case: Case) -> set[str]:
    """Which boundaries of one plain step really hold finite values beyond float32's range."""
    torch.manual_seed(0)
    model = case.build()
    outs: list[torch.Tensor] = []
    grads: list[torch.Tensor] = []

    def keep(m: nn.Module, a: object, out: torch.Tensor) -> None:
        outs.append(out.detach())
        if out.requires_grad:
            out.register_hook(lambda g: grads.append(g.detach()))

    handles = [m.register_forward_hook(keep) for m in model.modules()]
    x, y = case.batch(torch.Generator().manual_seed(0))
    loss = case.loss(model(x), y)
    loss.backward()
    for h in handles:
        h.remove()
    everything = [*outs, *grads, loss.detach(), *(p.detach() for p in model.parameters())]
    everything += [p.grad for p in model.parameters() if p.grad is not None]
    assert all(torch.isfinite(t).all() for t in everything)
    found = set()
    if any(t.abs().max() > F32_MAX for t in outs):
        found.add("forward")
    if loss.abs() > F32_MAX:
        found.add("loss")
    if any(t.abs().max() > F32_MAX for t in grads) or any(
        torch.linalg.vector_norm(p.grad) > F32_MAX for p in model.parameters() if p.grad is not None
    ):
        found.add("gradients")
    if any(torch.linalg.vector_norm(p) > F32_MAX for p in model.parameters()):
        found.add("updates")
    return found


@pytest.mark.parametrize("name", list(CASES), ids=list(CASES))
def test_each_model_really_holds_finite_values_beyond_float32(name: str) -> None:
    case = CASES[name]
    assert case.beyond in _beyond_float32_by_hand(case)


@pytest.mark.parametrize("name", list(CASES), ids=list(CASES))
def test_finite_float64_values_beyond_float32_range_are_not_non_finite(name: str, check_mode: str) -> None:
    case = CASES[name]
    torch.manual_seed(0)
    model = case.build()
    opt = torch.optim.SGD(model.parameters(), lr=case.lr)
    s = torch_sentinel.attach(model, opt, check=check_mode, update_every=1)
    err = _caught(s, lambda: _train(s, model, opt, case, 4))
    assert err is None, str(err)
    assert s.report().by_kind("non_finite") == []


def test_the_issue_reproduction_stays_quiet_and_records_the_true_loss(check_mode: str) -> None:
    torch.manual_seed(0)
    m = nn.Linear(4, 1).double()
    opt = torch.optim.SGD(m.parameters(), lr=1e-50)
    x = torch.randn(8, 4, dtype=torch.float64) * 1e20
    with torch_sentinel.attach(m, opt, check=check_mode) as s:
        opt.zero_grad()
        loss = (m(x) ** 2).mean()  # about 1e40, finite in float64
        loss.backward()
        opt.step()
    assert s.report().by_kind("non_finite") == []
    assert loss.item() > F32_MAX


def test_explicit_and_validation_losses_beyond_float32_are_not_non_finite(check_mode: str) -> None:
    case = CASES["loss"]
    torch.manual_seed(0)
    model = case.build()
    opt = torch.optim.SGD(model.parameters(), lr=case.lr)
    s = torch_sentinel.attach(model, opt, check=check_mode)
    err = _caught(s, lambda: _train(s, model, opt, case, 3, observe=True))
    assert err is None, str(err)
    assert s.report().by_kind("non_finite") == []


def _nan_output(model: nn.Module, module: str, at: int, value: float) -> None:
    """Module ``module`` emits one ``value`` at step ``at`` (hook registered before attach)."""
    calls = [0]

    def spike(m: nn.Module, args: object, out: torch.Tensor) -> Optional[torch.Tensor]:
        calls[0] += 1
        if calls[0] - 1 != at:
            return None
        bad = out.clone()
        bad.view(-1)[0] = value
        return bad

    model.get_submodule(module).register_forward_hook(spike)


_COUNTS = re.compile(r"with (\d+) NaN, (\d+) \+Inf, (\d+) -Inf")


def _assert_message_names_what_it_found(err: NonFiniteError) -> None:
    text = str(err)
    m = _COUNTS.search(text)
    if m is not None:
        assert sum(int(k) for k in m.groups()) > 0, text
    else:
        assert re.search(r"with (NaN|\+Inf|-Inf|Inf)(, (NaN|\+Inf|-Inf))* present", text), text


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("nan_activation", (3, "forward", "3", (1, 0, 0))),
        ("inf_activation", (3, "forward", "2", (0, 1, 0))),
        ("nan_loss", (3, "loss", None, (1, 0, 0))),
        ("inf_weight", (2, "updates", "0", None)),
    ],
    ids=["nan-activation", "inf-activation", "nan-loss", "inf-weight"],
)
def test_a_real_fault_in_a_float64_model_beyond_float32_is_caught_at_its_step_and_module(
    fault: str, expected: tuple, check_mode: str
) -> None:
    case = CASES["activations"]
    torch.manual_seed(0)
    model = case.build()
    opt = torch.optim.SGD(model.parameters(), lr=case.lr)
    corrupt_loss_at = None
    before_step = None
    if fault == "nan_activation":
        _nan_output(model, "3", 3, math.nan)
    elif fault == "inf_activation":
        _nan_output(model, "2", 3, math.inf)
    elif fault == "nan_loss":
        corrupt_loss_at = 3
    else:
        def before_step(step: int) -> None:
            if step == 3:
                with torch.no_grad():
                    model[0].weight.view(-1)[0] = math.inf

    s = torch_sentinel.attach(model, opt, check=check_mode)
    err = _caught(s, lambda: _train(s, model, opt, case, 6, corrupt_loss_at=corrupt_loss_at, before_step=before_step))
    assert err is not None
    step, boundary, module, counts = expected
    assert (err.step, err.boundary, err.module) == (step, boundary, module)
    assert err.dtype in ("float64", None)
    if check_mode == "immediate" and counts is not None:
        assert (err.nan, err.posinf, err.neginf) == counts
    _assert_message_names_what_it_found(err)


# ------------------------------------------------------------------ low precision
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_low_precision_models_train_quietly_and_a_nan_is_caught(dtype: torch.dtype, check_mode: str) -> None:
    def run(fault: bool) -> tuple[Optional[NonFiniteError], torch_sentinel.Sentinel]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 2)).to(dtype)
        if fault:
            _nan_output(model, "2", 2, math.nan)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        s = torch_sentinel.attach(model, opt, check=check_mode)
        g = torch.Generator().manual_seed(0)

        def loop() -> None:
            for _ in range(4):
                x = torch.randn(8, 8, generator=g).to(dtype)
                opt.zero_grad()
                model(x).float().pow(2).mean().backward()
                opt.step()

        return _caught(s, loop), s

    err, s = run(fault=False)
    assert err is None and s.report().by_kind("non_finite") == []
    err, _ = run(fault=True)
    assert err is not None
    assert (err.step, err.boundary, err.module) == (2, "forward", "2")
    assert err.dtype in (str(dtype).replace("torch.", ""), None)
    _assert_message_names_what_it_found(err)


def test_fp16_norms_beyond_fp16_range_of_finite_values_are_not_non_finite(check_mode: str) -> None:
    torch.manual_seed(0)
    # Weights of 300 in a 256x256 layer: every value is an ordinary fp16 number, the L2 norm
    # (76,800) is beyond fp16's 65,504; inputs are scaled so the outputs stay in range.
    model = nn.Sequential(Units(1e-4), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 2)).half()
    with torch.no_grad():
        model[1].weight.fill_(300.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    s = torch_sentinel.attach(model, opt, check=check_mode, update_every=1)

    def loop() -> None:
        for _ in range(3):
            opt.zero_grad()
            out = model(torch.randn(4, 256).half())
            assert torch.isfinite(out).all()
            out.float().pow(2).mean().backward()
            opt.step()

    err = _caught(s, loop)
    assert err is None, str(err)
    assert s.report().by_kind("non_finite") == []


# ------------------------------------------------------------------ float8
F8 = torch.float8_e4m3fn


class ToFloat8(nn.Module):
    """Stores an activation in float8, as FP8 training recipes do between layers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(F8)


class FromFloat8(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float32)


class Float8Linear(nn.Module):
    """A frozen layer whose weight is stored in float8 and upcast for the matmul."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter((torch.randn(d_out, d_in) * 0.3).to(F8), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.to(x.dtype).t()


def _reduces(dtype: torch.dtype) -> bool:
    try:
        torch.aminmax(torch.zeros(2, dtype=dtype))
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return True


def _float8_run(check_mode: str, fault_at: Optional[int], steps: int = 5):
    torch.manual_seed(0)
    model = nn.Sequential(FromFloat8(), nn.Linear(8, 8), ToFloat8(), FromFloat8(), nn.Linear(8, 8), Float8Linear(8, 2))
    if fault_at is not None:
        _nan_output(model, "4", fault_at, math.nan)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(8, 8, generator=g).to(F8) for _ in range(steps)]
    per_step: list[list[str]] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = torch_sentinel.attach(model, opt, check=check_mode, update_every=1)

        def loop() -> None:
            for x in batches:
                seen = len(caught)
                opt.zero_grad()
                model(x).pow(2).mean().backward()
                opt.step()
                per_step.append([str(w.message) for w in caught[seen:]])

        err = _caught(s, loop)
    messages = [str(w.message) for w in caught if "float8" in str(w.message)]
    return err, s, messages, per_step


def test_float8_tensors_are_watched_or_skipped_with_one_warning_never_a_crash(check_mode: str) -> None:
    err, s, messages, per_step = _float8_run(check_mode, fault_at=None)
    assert err is None, str(err)
    assert s.report().by_kind("non_finite") == []
    if _reduces(F8):
        assert messages == []
    else:
        assert messages, "an unsupported float8 reduction was skipped without a word"
        assert len(messages) == len(set(messages))  # one warning per probe, not one per call
        assert all("float8_e4m3fn" in m and "not watched" in m for m in messages)
        assert all(not any("float8" in m for m in later) for later in per_step[1:])  # not repeated


def test_a_nan_after_a_float8_stage_is_still_caught_at_its_step_and_module(check_mode: str) -> None:
    err, _, _, _ = _float8_run(check_mode, fault_at=2)
    assert err is not None
    assert (err.step, err.boundary, err.module) == (2, "forward", "4")
    _assert_message_names_what_it_found(err)
