"""Shape notes at any step, from hooks on the model's entry only (shapes/watch.py).

Ordinary steps carry no per-module note hook; when a shape error leaves the model, the forward
runs again with the note hooks installed and the note lands on the original error, as full as
on a step that carried them. The rerun leaves no trace: buffers, RNG state and training stay
bit-identical to an unattached twin.
"""

from __future__ import annotations

import gc
import warnings
import weakref
from typing import Any, Optional

import pytest
import torch
from helpers import EncoderDecoder
from torch import nn

import torch_sentinel
from torch_sentinel.shapes.notes import ShapeNotes
from torch_sentinel.shapes.watch import ShapeWatch


class Unflatten8(nn.Module):
    """Reshapes to a hard-coded batch of 8: the last, smaller batch of an epoch breaks it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(8, 4, 8)  # BUG: the batch size is hard-coded


def _reshaping_model() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), Unflatten8(), nn.Flatten(), nn.Linear(32, 4))


def _notes(exc: BaseException) -> list[str]:
    return [n for n in getattr(exc, "__notes__", []) if n.startswith("torch_sentinel:")]


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


def _shape_hooks(module: nn.Module) -> int:
    """Forward hooks and pre-hooks of the shape notes on ``module``."""
    hooks = [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]
    return sum(isinstance(getattr(getattr(h, "func", None), "__self__", None), (ShapeNotes, ShapeWatch)) for h in hooks)


def _note_at(step: int) -> tuple[str, Any]:
    torch.manual_seed(0)
    model = _reshaping_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torch_sentinel.attach(model, opt) as sentinel:
        for _ in range(step):
            _step(model, opt, torch.randn(8, 16))
        with pytest.raises(RuntimeError, match=r"shape '\[8, 4, 8\]' is invalid") as info:
            _step(model, opt, torch.randn(5, 16))  # the epoch's last batch
        notes = _notes(info.value)
        assert len(notes) == 1
        found = sentinel.report().by_kind("shape_mismatch")
    assert len(found) == 1 and found[0].step == step
    return notes[0], found[0].evidence


def test_a_shape_error_at_a_later_step_gets_the_same_full_note_as_at_step_0() -> None:
    first, first_evidence = _note_at(0)
    later, later_evidence = _note_at(12)
    assert "shape mismatch in module '2' (Unflatten8) at step 0" in first
    assert "args[0] (5, 32) float32, produced by module '1' (Tanh)" in first
    assert later == first.replace("at step 0", "at step 12")
    assert later_evidence == first_evidence


@pytest.mark.parametrize("pairs", [3, 16], ids=["small-root", "large-root"])
def test_ordinary_steps_carry_no_per_module_note_hook(pairs: int) -> None:
    model = nn.Sequential(*[m for _ in range(pairs) for m in (nn.Linear(8, 8), nn.Tanh())])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torch_sentinel.attach(model, opt):
        for _ in range(3):
            _step(model, opt, torch.randn(4, 8))
            assert _shape_hooks(model) == 2  # the root's pre-hook and always-called hook
            assert sum(_shape_hooks(m) for m in model.modules() if m is not model) == 0
        with pytest.raises(RuntimeError) as info:
            model(torch.randn(4, 9))
        assert "produced by the model's input (the batch)" in _notes(info.value)[0]
        # The rerun's hooks are gone again.
        assert sum(_shape_hooks(m) for m in model.modules() if m is not model) == 0
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


class Noisy(nn.Module):
    """BatchNorm (running statistics) and dropout (RNG) before a layer that rejects the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.norm = nn.BatchNorm1d(32)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.norm(self.fc(x)))
        return self.head(h[:, :16] if x.shape[0] == 5 else h)  # BUG: a slice for odd batches


def _train_with_a_shape_error(attach: bool) -> tuple[dict[str, torch.Tensor], torch.Tensor, list[str]]:
    torch.manual_seed(0)
    model = Noisy()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sentinel = torch_sentinel.attach(model, opt) if attach else None
    notes: list[str] = []
    for i in range(14):
        x = torch.randn(5 if i == 12 else 8, 16)
        try:
            _step(model, opt, x)
        except RuntimeError as exc:  # the loop skips the bad batch
            notes = _notes(exc)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    if sentinel is not None:
        sentinel.detach()
    return state, rng, notes


def test_the_rerun_leaves_buffers_rng_and_training_bit_identical_to_an_unattached_twin() -> None:
    bare_state, bare_rng, _ = _train_with_a_shape_error(attach=False)
    state, rng, notes = _train_with_a_shape_error(attach=True)
    assert torch.equal(rng, bare_rng)
    assert bare_state.keys() == state.keys()
    for k in state:
        assert torch.equal(state[k], bare_state[k]), k  # running_mean/var, num_batches_tracked, weights
    assert len(notes) == 1
    assert "shape mismatch in module 'head' (Linear) at step 12" in notes[0]
    assert "Feature mismatch: input has 16 features, but head expects 32" in notes[0]
    # Traced by the rerun: the slice is functional code in the model's forward.
    assert "produced by functional code in the forward of '<model>', or the model's input" in notes[0]


class FlakyShape(nn.Module):
    """Raises a shape error on its first call only: a rerun cannot reproduce it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError(f"size mismatch: got {tuple(x.shape)}")
        return self.fc(x)


def test_an_error_the_rerun_does_not_reproduce_gets_a_note_from_the_traceback() -> None:
    inner = FlakyShape()
    model = nn.Sequential(nn.Linear(4, 4), inner)
    with torch_sentinel.attach(model, torch.optim.SGD(model.parameters(), lr=0.1)) as sentinel:
        with pytest.raises(RuntimeError, match="size mismatch") as info:
            model(torch.randn(2, 4))
        notes = _notes(info.value)
        assert inner.calls == 2  # the rerun ran, and succeeded
        assert len(notes) == 1 and "shape mismatch in module '1' (FlakyShape) at step 0" in notes[0]
        assert "args[0] (2, 4) float32, produced by not traced" in notes[0]
        assert [f.module for f in sentinel.report().by_kind("shape_mismatch")] == ["1"]


class Counting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        raise ValueError("the data loader ran dry")


def test_errors_that_are_not_about_shapes_are_not_run_again() -> None:
    inner = Counting()
    model = nn.Sequential(nn.Linear(4, 4), inner)
    with torch_sentinel.attach(model, torch.optim.SGD(model.parameters(), lr=0.1)) as sentinel:
        with pytest.raises(ValueError, match="ran dry") as info:
            model(torch.randn(2, 4))
        assert inner.calls == 1
        assert _notes(info.value) == []
        assert sentinel.report().by_kind("shape_mismatch") == []


class Gan(nn.Module):
    """A container whose children the loop calls (no forward of its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.netG = nn.Sequential(nn.Linear(4, 12), nn.Tanh())
        self.netD = nn.Sequential(nn.Linear(8, 1))  # BUG: netG makes 12 features


def test_children_the_loop_calls_directly_get_the_full_note() -> None:
    gan = Gan()
    opt = torch.optim.SGD(gan.parameters(), lr=0.1)
    with torch_sentinel.attach(gan, opt) as sentinel:
        with pytest.raises(RuntimeError, match="mat1 and mat2") as info:
            gan.netD(gan.netG(torch.randn(3, 4)))
        notes = _notes(info.value)
        assert len(notes) == 1
        assert "shape mismatch in module 'netD.0' (Linear) at step 0" in notes[0]
        assert "args[0] (3, 12) float32, produced by module 'netG' (Sequential)" in notes[0]
        assert [f.module for f in sentinel.report().by_kind("shape_mismatch")] == ["netD.0"]
        assert all(_shape_hooks(m) == 0 for m in (*gan.netG.modules(), *gan.netD.modules())
                   if m is not gan.netG and m is not gan.netD)


@pytest.mark.parametrize("children", [3, 20], ids=["small-root", "large-root"])
def test_a_loop_that_calls_the_children_of_a_root_gets_their_hooks_back(children: int) -> None:
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(children)])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_sentinel.attach(model, opt):
        _step(model, opt, torch.randn(2, 4))
        assert _shape_hooks(model[0]) == 0
        opt.zero_grad()
        model[1](model[0](torch.randn(2, 4))).sum().backward()  # no call of the root this step
        opt.step()
        assert _shape_hooks(model[0]) == 2
        with pytest.raises(RuntimeError) as info:
            model[1](model[0](torch.randn(2, 3)))
        assert "shape mismatch in module '0' (Linear) at step 2" in _notes(info.value)[0]


def _call_and_drop(model: nn.Module, x: torch.Tensor) -> Optional[str]:
    try:
        model(x)
    except RuntimeError as exc:
        return _notes(exc)[0]
    return None


def test_no_activation_or_batch_outlives_the_explained_step() -> None:
    made: list[weakref.ref[torch.Tensor]] = []

    class Spy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x * 2
            made.append(weakref.ref(y))
            return y

    model = nn.Sequential(nn.Linear(16, 32), Spy(), Unflatten8())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_sentinel.attach(model, opt):
        x = torch.randn(5, 16)
        batch = weakref.ref(x)
        note = _call_and_drop(model, x)
        assert note is not None and "produced by module '1' (Spy)" in note
        assert len(made) == 2  # the step's forward and the rerun
        del x
        model[2] = nn.Flatten()  # the loop fixed the bug, and trains on
        _step(model, opt, torch.randn(8, 16))
        made.pop()
        gc.collect()
        assert batch() is None
        assert all(r() is None for r in made)


def test_an_error_in_an_evaluation_forward_under_no_grad_gets_the_note() -> None:
    torch.manual_seed(0)
    model = _reshaping_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torch_sentinel.attach(model, opt):
        for _ in range(3):
            _step(model, opt, torch.randn(8, 16))
        model.eval()
        with torch.no_grad(), pytest.raises(RuntimeError) as info:
            model(torch.randn(5, 16))
    note = _notes(info.value)[0]
    assert "shape mismatch in module '2' (Unflatten8) at step 3" in note
    assert "args[0] (5, 32) float32, produced by module '1' (Tanh)" in note


@pytest.mark.parametrize("order", ["attach_then_compile", "compile_then_attach"])
def test_a_shape_error_raised_while_compiling_names_the_layer_found_eagerly(order: str) -> None:
    torch._dynamo.reset()
    model = EncoderDecoder()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if order == "attach_then_compile":
        sentinel = torch_sentinel.attach(model, opt)
        compiled = torch.compile(model, backend="eager")
    else:
        compiled = torch.compile(model, backend="eager")
        sentinel = torch_sentinel.attach(compiled, opt)
    try:
        with pytest.raises(Exception) as info:
            compiled(torch.randn(8, 20))
        notes = _notes(info.value)
        assert len(notes) == 1
        assert "shape mismatch in module 'decoder' (Linear) at step 0" in notes[0]
        assert "args[0] (8, 32) float32, produced by module 'act' (ReLU)" in notes[0]
        assert "located by running the forward again eagerly" in notes[0]
        assert [f.module for f in sentinel.report().by_kind("shape_mismatch")] == ["decoder"]
    finally:
        sentinel.detach()
        torch._dynamo.reset()


class _NaNLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x).clone()
        y[0, 0] = float("nan")
        return y


def test_the_shape_rerun_records_nothing_into_the_step() -> None:
    """Regression: the shape rerun's outputs went into the collector's pending batch; with the
    failed forward's own pending NaN they filled it and raised a NonFiniteError inside the rerun."""
    torch.manual_seed(0)
    # 66 checked outputs before the NaN: the first 64 are reduced mid-forward, the NaN stays pending.
    layers: list[nn.Module] = [nn.Linear(8, 8) for _ in range(66)] + [_NaNLinear(8, 8), nn.Linear(7, 8)]
    model = nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch_sentinel.attach(model, opt) as sentinel, \
                pytest.raises(RuntimeError, match="mat1 and mat2") as info:
            model(torch.randn(4, 8))
    assert "'67'" in "\n".join(getattr(info.value, "__notes__", []))
    # No NonFiniteError raised (and swallowed) inside the rerun: the pending NaN of the failed
    # forward is the next forward's to report, as for any forward that raised.
    assert [f.kind for f in sentinel.findings] == ["shape_mismatch"]
    assert sentinel.nonfinite_raised == 0
