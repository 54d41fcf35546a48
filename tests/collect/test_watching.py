"""Module hooks by step (watching.py) and the rerun that localises a fault on an ordinary step."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

import torch_sentinel
from torch_sentinel import NonFiniteError
from torch_sentinel._collect.hookset import ModuleHook
from torch_sentinel._errors import raised_at_entry


class Poison(nn.Module):
    """A Linear whose output gets one NaN while ``active`` (set by the loop for one step)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.active = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.active:
            y = y.clone()
            y[0, 0] = float("nan")
        return y


def _stack(n: int, bad: int = -1) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[Poison() if i == bad else nn.Linear(8, 8) if i % 2 == 0 else nn.Tanh()
                           for i in range(n)])


def _batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)) for _ in range(steps)]


def _hooked(model: nn.Module) -> int:
    """Submodules carrying the collector's forward hook now (torch keeps hooks in a dict)."""
    def collector_hook(h: Any) -> bool:
        fn = getattr(h, "func", None)
        if fn is raised_at_entry:  # the hooks where the user's call enters: the method is its argument
            fn = h.args[0]
        return isinstance(h, ModuleHook) and type(getattr(fn, "__self__", None)).__name__ == "ForwardEvents"
    return sum(1 for m in list(model.modules())[1:] if any(map(collector_hook, m._forward_hooks.values())))


def test_ordinary_steps_hook_only_the_root_and_full_steps_hook_every_module() -> None:
    model = _stack(40)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    counts = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch_sentinel.attach(model, opt):
            for x, y in _batches(22):
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                counts.append(_hooked(model))  # for the next step
    # After step s closes, the hooks are those of step s + 1: steps 1-9 and 10 are full, 11-19 not.
    assert counts[:10] == [40] * 10
    assert max(counts[10:19]) <= 2, counts  # the root, plus the last layer whose output feeds the loss
    assert counts[19] == 40  # step 20
    assert _hooked_after_detach(model) == 0


def test_a_module_hooked_again_on_a_later_sampled_step_gets_the_same_hook_object() -> None:
    """The hooks of a sampled step are made once per module, not again at every sampled step:
    thousands of objects a sampled step that the garbage collector would carry into its
    oldest generation (tests/collect/test_gc_pressure.py)."""
    model = _stack(10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen: dict[int, list[ModuleHook]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch_sentinel.attach(model, opt):
            for step, (x, y) in enumerate(_batches(22)):
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                if step in (9, 19):  # the hooks now are those of sampled steps 10 and 20
                    seen[step] = [h for h in model[4]._forward_hooks.values() if isinstance(h, ModuleHook)]
                if step == 12:
                    assert not model[4]._forward_hooks  # removed in between
    assert len(seen[9]) == 1 and len(seen[19]) == 1 and seen[9][0] is seen[19][0]


def _hooked_after_detach(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) for m in model.modules())


@pytest.mark.parametrize("step", [3, 15], ids=["full-step", "ordinary-step"])
def test_a_nan_on_any_step_names_the_module_that_made_it(step: int) -> None:
    model = _stack(30, bad=11)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(NonFiniteError, match=rf"step {step}\b.*'11'") as info, \
                torch_sentinel.attach(model, opt):
            for i, (x, y) in enumerate(_batches(20)):
                model[11].active = i == step
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
    err = info.value
    assert (err.step, err.boundary, err.module) == (step, "forward", "11")
    if step == 15:
        assert "run again with every module watched" in err.evidence["located_by"]


class FunctionalNaN(nn.Module):
    """The NaN is made by the model's own forward code, after its last submodule."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _stack(6)
        self.active = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return y.log() if self.active else y


def test_a_nan_from_the_roots_own_code_on_an_ordinary_step_is_charged_to_the_root() -> None:
    model = FunctionalNaN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(NonFiniteError, match=r"step 13\b") as info, torch_sentinel.attach(model, opt):
            for i, (x, y) in enumerate(_batches(20)):
                model.active = i == 13
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
    assert (info.value.step, info.value.module) == (13, "")
    assert "the model's own forward code" in info.value.evidence["located_by"]


class Noisy(nn.Module):
    """BatchNorm (buffers a forward changes) and Dropout (draws from the RNG) around a Poison."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)
        self.poison = Poison()
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.poison(self.drop(self.bn(x))))


def _run_skipping_bad_batches(attached: bool) -> tuple[dict[str, Any], torch.Tensor, list[int]]:
    """A loop that catches the error and goes on with the next batch."""
    torch.manual_seed(0)
    model = Noisy()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sentinel = torch_sentinel.attach(model, opt) if attached else None
    torch.manual_seed(5)
    skipped = []
    for i, (x, y) in enumerate(_batches(20)):
        model.poison.active = i == 14
        opt.zero_grad()
        try:
            out = model(x)
        except NonFiniteError:
            skipped.append(i)
            continue
        if not attached and i == 14:
            skipped.append(i)  # the twin skips the same batch, after the same forward
            continue
        nn.functional.mse_loss(out, y).backward()
        opt.step()
    if sentinel is not None:
        sentinel.detach()
    return model.state_dict(), torch.get_rng_state(), skipped


def test_the_rerun_leaves_buffers_rng_and_training_as_they_were() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state, rng, skipped = _run_skipping_bad_batches(attached=True)
        twin_state, twin_rng, twin_skipped = _run_skipping_bad_batches(attached=False)
    assert skipped == twin_skipped == [14]
    assert torch.equal(rng, twin_rng)
    for k, v in twin_state.items():
        assert torch.equal(state[k], v), k  # weights and BatchNorm's running statistics, bit for bit


def test_deferred_mode_hooks_every_module_on_every_step() -> None:
    model = _stack(12)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torch_sentinel.attach(model, opt, check="deferred"):
        for x, y in _batches(14):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            assert _hooked(model) == 12


class TwoNets(nn.Module):
    """A container whose children the loop calls itself (the root's forward never runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = _stack(4)
        self.b = _stack(4)


def test_submodules_called_from_the_loop_stay_hooked_on_every_step() -> None:
    model = TwoNets()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch_sentinel.attach(model, opt):
            for x, y in _batches(14):
                opt.zero_grad()
                nn.functional.mse_loss(model.b(model.a(x)), y).backward()
                opt.step()
            assert _hooked(model) == len(list(model.modules())) - 1


@pytest.mark.parametrize("check", ["immediate", "deferred"], ids=["immediate", "deferred"])
def test_a_user_hook_registered_after_attach_runs_before_the_sentinels(check: str) -> None:
    """torch runs forward hooks in registration order; a kept hook is registered again, last,
    so a NaN a later user hook writes into a module's output is charged to that module (the
    last layer keeps its hook every step: its output feeds the loss)."""
    model = _stack(10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    poison = [False]

    def inject(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        return output * float("nan") if poison[0] else output

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(NonFiniteError, match=r"step 5\b.*'8'") as info, \
                torch_sentinel.attach(model, opt, check=check):
            model[8].register_forward_hook(inject)
            for i, (x, y) in enumerate(_batches(8)):
                poison[0] = i == 5
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
    assert (info.value.step, info.value.module) == (5, "8")


def test_two_sentinels_on_one_module_keep_their_hooks_in_place() -> None:
    """Another sentinel's hooks only read the output: no re-registering every step."""
    inner = _stack(6)
    outer = nn.Sequential(inner)
    opt = torch.optim.SGD(inner.parameters(), lr=0.01)
    ids = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch_sentinel.attach(inner, opt), torch_sentinel.attach(outer):
            for x, y in _batches(14):
                opt.zero_grad()
                nn.functional.mse_loss(outer(x), y).backward()
                opt.step()
                ids.append(tuple(inner[5]._forward_hooks))
    assert len(set(ids[10:])) == 1, ids  # past the full steps: the same hooks, not re-made
