"""The batched hot path: one reduction per boundary, exact localisation, nothing held past it."""

from __future__ import annotations

import gc
import math
import warnings
import weakref

import numpy as np
import pytest
import torch
from torch import nn

import torch_sentinel
from torch_sentinel import NonFiniteError
from torch_sentinel._collect import batch
from torch_sentinel.testing import count_launches


class Poison(nn.Module):
    """A Linear that turns one output value into NaN (or +Inf) from step ``at`` on."""

    def __init__(self, at: int, value: float) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.at, self.value, self.calls = at, value, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        self.calls += 1
        if self.calls > self.at:
            y = y.clone()
            y[0, 0] = self.value
        return y


def _stack(n: int, bad: int = -1, at: int = 0, value: float = float("nan")) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[Poison(at, value) if i == bad else nn.Linear(8, 8) if i % 2 == 0 else nn.Tanh()
                           for i in range(n)])


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


@pytest.fixture(params=[False, True], ids=["loop", "fused"])
def strategy(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Both reduction strategies: per-tensor aminmax (CPU) and the multi-tensor one (accelerators)."""
    monkeypatch.setattr(batch, "FUSED_ON_CPU", request.param)
    return bool(request.param)


@pytest.mark.parametrize("check", ["immediate", "deferred"], ids=["immediate", "deferred"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_the_first_bad_module_and_step_are_exact_with_many_batched_outputs(check: str, value: float,
                                                                           strategy: bool) -> None:
    # 150 modules: more outputs than one batch holds, the bad one in the second batch.
    model = _stack(150, bad=100, at=3, value=value)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(NonFiniteError, match=r"step 3\b.*'100'") as info, \
                torch_sentinel.attach(model, opt, check=check):
            _train(model, opt, 6)
    err = info.value
    assert (err.step, err.boundary, err.module) == (3, "forward", "100")
    if check == "immediate":
        # Found among the batched per-tensor results; the tensor itself was still in hand.
        assert err.evidence["located_by"] == (
            "first non-finite module output in forward order among the batched checks of step 3")
        assert (err.nan, err.posinf, err.neginf) == (int(value != value), int(value == math.inf),
                                                     int(value == -math.inf))


def test_a_bad_output_gradient_is_charged_to_the_module_whose_backward_made_it(strategy: bool) -> None:
    class Blow(torch.autograd.Function):
        @staticmethod
        def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @staticmethod
        def backward(ctx: object, g: torch.Tensor) -> torch.Tensor:
            return g * float("inf")

    class Custom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return Blow.apply(x)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), Custom(), nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with pytest.raises(NonFiniteError) as info, torch_sentinel.attach(model, opt, check="immediate"):
        _train(model, opt, 1)
    err = info.value
    assert (err.step, err.boundary, err.module) == (0, "gradients", "3")
    assert err.evidence["incoming_to"] == "2"
    assert "batched checks of step 0" in err.evidence["located_by"]


def test_device_work_per_step_does_not_grow_with_the_module_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused reductions launch per boundary (a chunk of 64 outputs), not per module."""
    monkeypatch.setattr(batch, "FUSED_ON_CPU", True)

    def reductions(n: int) -> float:
        model = _stack(n)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # loss_spike's ring norms are one fixed set per step (tests/collect/test_launches.py)
            with torch_sentinel.attach(model, opt, check="deferred", flush_every=1000, disable={"loss_spike"}):
                _train(model, opt, 11)  # past the ten fully sampled first steps
                with count_launches() as c:
                    _train(model, opt, 1)
        return c.ops["_foreach_norm"] + c.ops.get("aminmax", 0)

    # 20 checked outputs fit one forward batch; 120 need two. Per module it was one each.
    assert reductions(40) <= 4
    assert reductions(240) <= 6


def test_no_module_output_is_held_past_its_forward(strategy: bool) -> None:
    model = _stack(10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen: list[weakref.ref[torch.Tensor]] = []
    model[4].register_forward_hook(lambda m, a, out: seen.append(weakref.ref(out)))
    with torch_sentinel.attach(model, opt, check="deferred"):
        with torch.no_grad():  # a no-grad forward is not watched at all
            model(torch.randn(4, 8))
        out = model(torch.randn(4, 8)).sum()  # a training forward without backward
        del out
        gc.collect()
        assert all(r() is None for r in seen)


def test_batched_saturation_fractions_are_those_of_one_by_one_reductions() -> None:
    """Bit for bit, in every dtype, with NaN and Inf, a slot recorded twice (the later call
    wins) and a tensor too large to stack (reduced on the spot)."""
    from torch_sentinel._collect.ledger import Ledger

    tanh_edge, sigmoid_edge = math.tanh(5.0), 0.5 - 1.0 / (1.0 + math.exp(5.0))
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for shift, edge, act in ((0.0, tanh_edge, torch.tanh), (0.5, sigmoid_edge, torch.sigmoid)):
            ledger = Ledger(torch.device("cpu"))
            block = ledger.add_block("saturation", [str(i) for i in range(12)])
            ledger.fit(dtype)
            pending = batch.BatchedFractions(ledger, cap=5)
            expected = {}
            for i, shape in enumerate([(4, 8)] * 6 + [(3, 5, 7)] * 3 + [(2,), (300, 300), (4, 8)]):
                slot = block.start + (i if i < 11 else 0)  # the last one records slot 0 again
                x = act(torch.randn(*shape, generator=g) * (i % 4) * 3).to(dtype)
                if i % 3 == 0:
                    x.view(-1)[0] = float("nan")
                if i % 4 == 1:
                    x.view(-1)[-1] = float("inf")
                pending.add(x, slot, shift, edge)
                one_by_one = (((x - shift) if shift else x).abs() > edge).float().mean()
                expected[slot] = one_by_one.to(ledger.dtype)
            pending.flush()
            got = ledger.current[block.start : block.stop]
            assert torch.equal(got, torch.stack([expected[block.start + i] for i in range(11)] + [got[11]]))


def _tanh_outputs_held(model: nn.Sequential, check: str) -> list[weakref.ref[np.ndarray]]:
    """Which Tanh outputs of one training forward are still alive after it. A weakref to the
    tensor would die with the tensor object while a detached alias keeps its memory, so each
    Tanh output is given memory that can be watched: a numpy array's, shared by the tensor and
    every alias of it."""
    seen: list[weakref.ref[np.ndarray]] = []

    def watched(m: nn.Module, args: object, out: torch.Tensor) -> torch.Tensor:
        memory = out.detach().numpy().copy()
        seen.append(weakref.ref(memory))
        return torch.from_numpy(memory).requires_grad_()

    for m in model:
        if isinstance(m, nn.Tanh):
            m.register_forward_hook(watched)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sentinel = torch_sentinel.attach(model, opt, check=check)
        try:
            out = model(torch.randn(4, 8)).sum()  # step 0: sampled, every saturation recorded
            del out
        except NonFiniteError:
            pass  # the forward raised mid-step: what it recorded belongs to an abandoned row
        gc.collect()
        held = [r for r in seen if r() is not None]
        sentinel.detach(quiet=True)
    assert seen
    return held


@pytest.mark.parametrize("check", ["immediate", "deferred"])
def test_no_tanh_output_is_held_past_its_forward_by_the_saturation_probe(check: str) -> None:
    assert _tanh_outputs_held(_stack(10), check) == []


def test_no_tanh_output_is_held_past_a_forward_that_raised() -> None:
    model = _stack(10, bad=8, at=0)  # a NaN at module 8, found at the end of the forward
    assert _tanh_outputs_held(model, "immediate") == []


def _reduce(tensors: list[torch.Tensor], slots: list[int], stack_min: int, immediate: bool,
            monkeypatch: pytest.MonkeyPatch) -> tuple[np.ndarray, list[int]]:
    """The ledger row after one loop-strategy flush of ``tensors`` into the pairs ``slots``,
    and the entries reported bad, in order."""
    from torch_sentinel._collect.dtypes import DtypePolicy
    from torch_sentinel._collect.ledger import Ledger

    monkeypatch.setattr(batch, "_STACK_MIN", stack_min)
    ledger = Ledger(torch.device("cpu"))
    lo, hi = ledger.add_minmax_block("out", [f"m{i}" for i in range(8)])
    pending = batch.BatchedMax(ledger, DtypePolicy(ledger), fused=False)
    pending.immediate = immediate
    reported: list[int] = []
    written: set[int] = set()
    for i, (t, s) in enumerate(zip(tensors, slots)):
        pending.add(t, lo.start + s, hi.start + s, "test", lambda _t, i=i: reported.append(i), written)
    pending.flush(written)
    return ledger.current.numpy().copy(), reported


@pytest.mark.parametrize("immediate", [False, True], ids=["deferred", "immediate"])
def test_the_loop_strategy_stacks_tensors_of_one_shape_with_the_same_results(
        immediate: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(3, 5, generator=g) * (i + 1) for i in range(6)]  # one group of six
    tensors += [torch.randn(7, generator=g), torch.randn(3, 5, generator=g).half()]  # left alone
    tensors += [torch.randn(3, 5, generator=g) * 9]  # slot 1 again: a module called twice
    tensors[4][1, 2] = float("nan")
    tensors[7][0, 0] = float("inf")
    slots = [0, 1, 2, 3, 4, 5, 6, 7, 1]
    one_by_one, bad_alone = _reduce(tensors, slots, 10**6, immediate, monkeypatch)
    stacked, bad_stacked = _reduce(tensors, slots, 4, immediate, monkeypatch)
    np.testing.assert_array_equal(stacked, one_by_one)
    assert math.isnan(stacked[4]) and math.isinf(stacked[8 + 7])
    assert stacked[1] == min(tensors[1].min().item(), tensors[8].min().item())
    assert bad_stacked == bad_alone == ([4, 7] if immediate else [])
