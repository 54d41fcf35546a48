"""Patches next to other libraries: stacking, removal in any order, restored originals, failures."""

from __future__ import annotations

import functools
import logging
from typing import Any

import pytest
import torch
from torch import nn
from userscript import events

import torch_sentinel
from torch_sentinel._collect.patches import RAISED, Patch


class Host:
    """A stand-in module owning a function, as ``torch.autograd`` owns ``backward``."""

    @staticmethod
    def fn(x: int) -> int:
        if x < 0:
            raise ValueError("negative")
        return x + 1


class Recorder:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.log.append(f"{self.name}.before{args}")

    def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        self.log.append(f"{self.name}.after={'raised' if result is RAISED else result}")


class Owner:
    fn = staticmethod(Host.fn)


def _foreign_wrap(owner: Any, log: list[str]) -> Any:
    saved = owner.fn

    @functools.wraps(saved)
    def foreign(*args: Any, **kwargs: Any) -> Any:
        log.append("foreign")
        return saved(*args, **kwargs)

    owner.fn = foreign
    return saved


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 0, 2), (0, 2, 1)],
                         ids=["ours-first", "foreign-first", "second-sentinel-first", "foreign-between"])
def test_two_sentinels_and_a_foreign_wrapper_removed_in_any_order_leave_the_original(
    order: tuple[int, ...],
) -> None:
    class Lib:
        fn = Owner.fn

    original = Lib.__dict__["fn"]
    log: list[str] = []
    patch = Patch(Lib, "fn")
    a, b = Recorder("a", log), Recorder("b", log)
    patch.add(a)
    saved = _foreign_wrap(Lib, log)
    patch.add(b)
    assert Lib.fn(1) == 2
    assert log == ["foreign", "a.before(1,)", "b.before(1,)", "a.after=2", "b.after=2"]
    removals = [lambda: patch.remove(a), lambda: patch.remove(b), lambda: setattr(Lib, "fn", saved)]
    for i in order:
        removals[i]()
        log.clear()
        assert Lib.fn(3) == 4  # the user's call always works, whatever is left installed
    assert not [entry for entry in log if entry[0] in "ab"]  # no listener left
    # Removed last, the foreign library puts back what it saved (our wrapper, now a
    # pass-through); otherwise the original is back exactly.
    assert Lib.__dict__["fn"] is (saved if order[-1] == 2 else original)


def test_a_library_restoring_its_saved_original_is_undone_before_the_next_step() -> None:
    log: list[str] = []

    class Lib:
        fn = Owner.fn

    saved = Lib.fn  # a library saved the function before we came
    patch = Patch(Lib, "fn")
    patch.add(Recorder("a", log))
    Lib.fn = saved  # ... and restores it later: our wrapper is gone
    Lib.fn(1)
    assert log == []
    assert patch.ensure() is True  # what the collector calls before each optimizer step
    Lib.fn(1)
    assert log == ["a.before(1,)", "a.after=2"]
    assert patch.ensure() is False


def test_a_listener_that_raises_is_dropped_with_one_warning_and_the_call_still_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Lib:
        fn = Owner.fn

    class Broken:
        def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            raise KeyError("bug")

        def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
            return None

    patch = Patch(Lib, "fn")
    patch.add(Broken())
    with caplog.at_level(logging.WARNING, logger="torch_sentinel"):
        assert Lib.fn(1) == 2
        assert Lib.fn(2) == 3
    assert len([r for r in caplog.records if "failed and is switched off" in r.message]) == 1


def test_after_listeners_run_when_the_original_raises_and_the_error_is_the_users() -> None:
    class Lib:
        fn = Owner.fn

    log: list[str] = []
    patch = Patch(Lib, "fn")
    patch.add(Recorder("a", log))
    with pytest.raises(ValueError, match="negative"):
        Lib.fn(-1)
    assert log == ["a.before(-1,)", "a.after=raised"]


def test_loss_capture_survives_a_library_that_restores_torch_autograd_backward() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    saved = torch.autograd.backward  # a tool saved it before attach() ...
    expected = []
    with torch_sentinel.attach(model, opt) as sentinel:
        for step in range(4):
            if step == 1:
                torch.autograd.backward = saved  # ... and restores it while attached
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            opt.step()
            expected.append(loss.item())
        sentinel.flush()
        recorded = [r.loss for r in sentinel.recent_records()]
    assert torch.autograd.backward is saved
    # Found missing at step 1's forward and wrapped again, before its backward: no step lost.
    assert recorded == expected


class _Library:
    """Another library that wraps ``owner.attr`` (saving what it found) and later puts back
    what it saved."""

    def __init__(self, owner: Any, attr: str) -> None:
        self.owner, self.attr = owner, attr
        self.saved: Any = None

    def wrap(self) -> None:
        self.saved = saved = self.owner.__dict__[self.attr]

        @functools.wraps(saved)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return saved(*args, **kwargs)

        setattr(self.owner, self.attr, wrapper)

    def restore(self) -> None:
        setattr(self.owner, self.attr, self.saved)


@pytest.mark.parametrize("restore_at", [0, 1], ids=["restored-before-step-0", "restored-before-step-1"])
@pytest.mark.parametrize("wrapped", ["before-attach", "after-attach"], ids=["wrapped-before-attach", "wrapped-after-attach"])
@pytest.mark.parametrize("target", ["autograd.backward", "Tensor.backward"], ids=["autograd.backward", "Tensor.backward"])
def test_every_steps_loss_reaches_tensorboard_next_to_a_library_that_wraps_and_restores_backward(
    target: str, wrapped: str, restore_at: int, tmp_path: Any
) -> None:
    owner = torch.autograd if target == "autograd.backward" else torch.Tensor
    original = owner.__dict__["backward"]
    library = _Library(owner, "backward")
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    expected = []
    try:
        if wrapped == "before-attach":
            library.wrap()
        sentinel = torch_sentinel.attach(model, opt, log_dir=str(tmp_path))
        if wrapped == "after-attach":
            library.wrap()
        with sentinel:
            for step in range(30):
                if step == restore_at:
                    library.restore()
                opt.zero_grad()
                loss = model(torch.randn(8, 4, generator=g)).pow(2).mean()
                loss.backward()
                opt.step()
                expected.append(loss.item())
    finally:
        owner.backward = original
    scalars = events(tmp_path).Scalars("loss/train")
    assert [e.step for e in scalars] == list(range(30))
    assert [e.value for e in scalars] == pytest.approx(expected)
