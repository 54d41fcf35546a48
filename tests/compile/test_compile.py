"""torch.compile: no graph breaks, no recompiles, faults still caught, and hooks proven alive.

Compiled with ``backend="aot_eager"`` (dynamo + AOT autograd, the same tracing and
functionalisation inductor gets, without its C++ build, which would take minutes on this CPU).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

import torch_sentinel
from torch_sentinel.detectors import builtin_detectors

BACKEND = "aot_eager"


class Net(nn.Module):
    def __init__(self, act: type[nn.Module] = nn.ReLU) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = act()
        self.fc2 = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    # Compiled code is process-wide; each test starts from none.
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _setup(seed: int = 0, act: type[nn.Module] = nn.ReLU) -> tuple[Net, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = Net(act)
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def _train(call: Callable[[torch.Tensor], torch.Tensor], opt: torch.optim.Optimizer, steps: int,
           nan_at: Optional[int] = None, start: int = 0) -> None:
    for step in range(start, start + steps):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
        if step == nan_at:
            x[1, 2] = float("nan")
        opt.zero_grad()
        call(x).pow(2).mean().backward()
        opt.step()


def _all_kinds() -> set[str]:
    return {d.kind for d in builtin_detectors()}


def _frames() -> int:
    return int(counters["frames"].get("total", 0))


# ---------------------------------------------------------------------------- graph breaks
@pytest.mark.parametrize("detectors", ["core", "default"], ids=["core", "default-detectors"])
def test_hooks_add_no_graph_breaks(detectors: str) -> None:
    model, opt = _setup()
    x = torch.randn(4, 8)
    # Trace the whole call, as torch.compile(model) does: explain(model) would trace forward()
    # alone and count the root's hooks, which run outside it, as separate graphs.
    bare = torch._dynamo.explain(lambda t: model(t))(x)
    disable = _all_kinds() if detectors == "core" else set()
    with torch_sentinel.attach(model, opt, disable=disable):
        torch._dynamo.reset()
        hooked = torch._dynamo.explain(lambda t: model(t))(x)
    assert bare.graph_break_count == 0, [(str(r.reason)[:200], r.user_stack[-1].filename, r.user_stack[-1].lineno) for r in bare.break_reasons]
    assert hooked.graph_break_count == 0, [str(r.reason) for r in hooked.break_reasons]
    assert hooked.graph_count == bare.graph_count


@pytest.mark.parametrize(
    "detectors",
    ["core", "default"],
    ids=["core", "default-detectors"],
)
def test_hooks_cause_no_recompiles(detectors: str) -> None:
    model, opt = _setup()
    disable = _all_kinds() if detectors == "core" else set()
    with torch_sentinel.attach(model, opt, disable=disable):
        compiled = torch.compile(model, backend="eager")  # recompiles are dynamo's business
        _train(compiled, opt, 2)
        warm = _frames()
        _train(compiled, opt, 5, start=2)
        assert _frames() == warm


# ---------------------------------------------------------------------------- faults
@pytest.mark.parametrize(
    ("order", "check"),
    [("attach-then-compile", "immediate"), ("compile-then-attach", "deferred")],
    ids=["attach-then-compile-immediate", "compile-then-attach-deferred"],
)
def test_healthy_quiet_and_nan_caught_at_its_step(order: str, check: str) -> None:
    model, opt = _setup()
    if order == "attach-then-compile":
        sentinel = torch_sentinel.attach(model, opt, check=check, flush_every=2)
        compiled = torch.compile(model, backend=BACKEND)
    else:
        compiled = torch.compile(model, backend=BACKEND)  # not called yet: hooks get traced
        sentinel = torch_sentinel.attach(compiled, opt, check=check, flush_every=2)
    with sentinel:
        _train(compiled, opt, 4)
        assert sentinel.report().ok, str(sentinel.report())
        assert sentinel._liveness.proven
        with pytest.raises(torch_sentinel.NonFiniteError, match=r"step 5, boundary 'data'") as info:
            _train(compiled, opt, 4, nan_at=5, start=4)
        assert info.value.step == 5
        assert info.value.boundary == "data"


# ---------------------------------------------------------------------------- liveness
# Tanh, not ReLU: the relu detector patches F.relu, a global that compiled code guards on, so
# attaching happens to force a recompile (with the hooks) for models calling it. The failure
# is real for every model whose code touches no patched function; test that one.
def _blind_after_first_call() -> tuple[nn.Module, Any, torch.optim.Optimizer]:
    """Case 1: the hooks are added after the model's first compiled call."""
    model, opt = _setup(act=nn.Tanh)
    compiled = torch.compile(model, backend=BACKEND)
    _train(compiled, opt, 1)
    return model, compiled, opt


def _blind_sibling_compiled() -> tuple[nn.Module, Any, torch.optim.Optimizer]:
    """Case 2: a hook-less instance of the same class was compiled earlier in the process."""
    sibling, sibling_opt = _setup(seed=1, act=nn.Tanh)
    _train(torch.compile(sibling, backend=BACKEND), sibling_opt, 1)
    model, opt = _setup(act=nn.Tanh)
    return model, None, opt


CASES = {"hooks-after-first-call": _blind_after_first_call, "sibling-compiled-first": _blind_sibling_compiled}


def _reproduces_blindness(model: nn.Module, compiled: Any) -> bool:
    """The failure itself, without the sentinel: a hook added now never runs."""
    calls: list[int] = []
    handle = model.fc1.register_forward_hook(lambda *a: calls.append(1))
    try:
        compiled(torch.randn(4, 8))  # the shape it was compiled for: no recompile
    finally:
        handle.remove()
    return not calls


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_skipped_hooks_are_reproduced_by_torch(case: str) -> None:
    model, compiled, _ = CASES[case]()
    if compiled is None:
        compiled = torch.compile(model, backend=BACKEND)
    assert _reproduces_blindness(model, compiled)


def _unrelated(x: torch.Tensor) -> torch.Tensor:
    return x.sin() + 1


def _compile_ids(fn: Callable[..., Any]) -> list[str]:
    return [str(e.compile_id) for e in torch._dynamo.eval_frame._debug_get_cache_entry_list(fn)]


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_blind_hooks_are_reset_for_this_model_only_and_then_proven(
    case: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    resets: list[int] = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1))
    other = torch.compile(_unrelated, backend=BACKEND)
    other(torch.randn(3))
    other_code = _compile_ids(_unrelated)
    model, compiled, opt = CASES[case]()
    sentinel = torch_sentinel.attach(model, opt, check="deferred", flush_every=2)
    if compiled is None:
        compiled = torch.compile(model, backend=BACKEND)
    with sentinel, caplog.at_level(logging.WARNING, logger="torch_sentinel"):
        _train(compiled, opt, 6)
        assert sentinel._liveness.reset_at is not None
        assert sentinel._liveness.proven
        assert any("of this model only" in r.getMessage() for r in caplog.records)
        assert [c.rpartition("(")[2] for c in sentinel._liveness.reset_codes] == ["forward)"]
        # Eyes open again: a NaN is caught at its step and where it started.
        with pytest.raises(torch_sentinel.NonFiniteError, match=r"step 7, boundary 'data'"):
            _train(compiled, opt, 3, nan_at=7, start=6)
    # Nothing process-wide: the unrelated function kept its compiled code, and runs it again
    # without compiling anything.
    assert resets == []
    assert _compile_ids(_unrelated) == other_code
    frames = _frames()
    other(torch.randn(3))
    assert _frames() == frames


def test_blind_hooks_of_a_compiled_container_root_are_reset_for_it() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    compiled = torch.compile(model, backend=BACKEND)
    _train(compiled, opt, 1)  # compiled before attach: the hooks below are skipped
    with torch_sentinel.attach(model, opt, check="deferred", flush_every=2) as sentinel:
        _train(compiled, opt, 6, start=1)
        assert sentinel._liveness.reset_at is not None and sentinel._liveness.proven


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_blind_hooks_raise_when_reset_is_not_wanted(case: str) -> None:
    model, compiled, opt = CASES[case]()
    sentinel = torch_sentinel.attach(model, opt, check="deferred", blind_hooks="raise")
    if compiled is None:
        compiled = torch.compile(model, backend=BACKEND)
    with sentinel, pytest.raises(torch_sentinel.InstrumentationError,
                                 match=r"(?s)never ran.*attach before the model's first compiled call"):
        _train(compiled, opt, 4)


def test_blind_hooks_option_is_validated_at_attach() -> None:
    model, opt = _setup()
    with pytest.raises(ValueError, match=r"blind_hooks='ignore' is not valid\n\s+expected: one of 'reset', 'raise'"):
        torch_sentinel.attach(model, opt, blind_hooks="ignore")


# ---------------------------------------------------------------------------- what is not watched
class FunctionalNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.relu(self.fc1(x)))  # FUNCTIONAL-RELU


@pytest.mark.parametrize("functional", [True, False], ids=["functional-relu", "relu-module"])
def test_unwatched_functional_relu_is_said_at_the_first_step(functional: bool) -> None:
    torch.manual_seed(0)
    model: nn.Module = FunctionalNet() if functional else Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with torch_sentinel.attach(model, opt, check="deferred", flush_every=2) as sentinel:
        _train(torch.compile(model, backend=BACKEND), opt, 3)
    infos = [f for f in sentinel.report().findings if f.kind == "dead_relu"]
    if not functional:
        assert infos == []  # nn.ReLU is watched under compile: nothing to say
        return
    (info,) = infos
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "# FUNCTIONAL-RELU" in text)
    assert (info.severity, info.step, info.evidence["not_watched"]) == ("info", 0, "dead_relu")
    assert info.evidence["functional_relu_calls"] == [f"{__file__}:{line}"]
    assert "ReLUs called as functions inside compiled code" in info.message


class LossInside(nn.Module):
    """Computes its own loss, as HF models with ``labels=`` and nanoGPT's ``forward(idx, targets)`` do."""

    def __init__(self) -> None:
        super().__init__()
        self.net = Net()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.net(x), y)


@pytest.mark.parametrize("inside", [True, False], ids=["loss-in-compiled-forward", "loss-in-the-loop"])
def test_a_loss_computed_inside_compiled_code_is_said_unwatched_at_the_first_step(inside: bool) -> None:
    torch.manual_seed(0)
    model = LossInside()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    compiled = torch.compile(model if inside else model.net, backend=BACKEND)
    g = torch.Generator().manual_seed(0)
    with torch_sentinel.attach(model, opt, check="deferred", flush_every=2) as sentinel:
        for _ in range(3):
            x, y = torch.randn(16, 8, generator=g), torch.randint(0, 2, (16,), generator=g)
            opt.zero_grad()
            loss = compiled(x, y) if inside else nn.functional.cross_entropy(compiled(x), y)
            loss.backward()
            opt.step()
    infos = [f for f in sentinel.report().findings if f.evidence.get("reason") == "torch.compile"
             and "loss_broadcast" in f.evidence.get("not_watched", ())]
    if not inside:
        assert infos == []  # the loss call is seen: nothing to say
        return
    (info,) = infos
    assert (info.kind, info.severity, info.step) == ("probabilities_as_logits", "info", 0)
    assert "computed inside compiled code" in info.message and "F.cross_entropy" in info.message
