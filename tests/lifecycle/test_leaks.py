"""No leaks: a model and sentinel dropped without detach() are garbage-collected, their last
window reaches the sinks, and the process-wide patches go with the last sentinel."""

from __future__ import annotations

import gc
import pathlib
import weakref
from typing import Any

import pytest
import torch
from helpers import MLP, make_batch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

import torch_sentinel

ORIGINAL_BACKWARD = torch.autograd.backward


def _train_attached(log_dir: pathlib.Path, steps: int = 7, **options: Any
                    ) -> tuple[MLP, torch.optim.Optimizer, torch_sentinel.Sentinel]:
    """An attached MLP trained ``steps`` steps; returns the model, optimizer and sentinel."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sentinel = torch_sentinel.attach(model, opt, log_dir=str(log_dir), **options)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x, y = make_batch("mlp", generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model, opt, sentinel


def _attach_and_train(log_dir: pathlib.Path, steps: int = 7) -> tuple[weakref.ref, weakref.ref]:
    model, _, sentinel = _train_attached(log_dir, steps)
    return weakref.ref(model), weakref.ref(sentinel)


def test_dropped_model_and_sentinel_are_collected_and_flushed(tmp_path: pathlib.Path) -> None:
    """A notebook cell run twice: the first model and sentinel are dropped, never detached."""
    first_model, first_sentinel = _attach_and_train(tmp_path / "a")
    second_model, second_sentinel = _attach_and_train(tmp_path / "b")
    gc.collect()
    assert first_model() is None and first_sentinel() is None
    assert second_model() is None and second_sentinel() is None
    assert torch.autograd.backward is ORIGINAL_BACKWARD  # the last sentinel took the patch with it
    for run in ("a", "b"):
        acc = EventAccumulator(str(tmp_path / run), size_guidance={"scalars": 0})
        acc.Reload()
        assert [e.step for e in acc.Scalars("loss/train")] == list(range(7))


def test_patches_stay_while_another_sentinel_lives(tmp_path: pathlib.Path) -> None:
    keep = MLP()
    kept = torch_sentinel.attach(keep)
    dropped_model, dropped = _attach_and_train(tmp_path)
    gc.collect()
    assert dropped_model() is None and dropped() is None
    assert torch.autograd.backward is not ORIGINAL_BACKWARD  # still needed by `kept`
    kept.detach()
    assert torch.autograd.backward is ORIGINAL_BACKWARD


def _train_and_keep_sentinel(log_dir: pathlib.Path, check: str, keep_optimizer: bool, steps: int = 7
                             ) -> tuple[torch_sentinel.Sentinel, weakref.ref, weakref.ref, object]:
    model, opt, sentinel = _train_attached(log_dir, steps, check=check)
    kept = opt if keep_optimizer else None
    return sentinel, weakref.ref(model), weakref.ref(model.head.weight if not keep_optimizer else model.act), kept


@pytest.mark.parametrize("keep_optimizer", [False, True], ids=["model-and-optimizer-dropped", "optimizer-kept"])
@pytest.mark.parametrize("check", ["immediate", "deferred"])
def test_a_kept_sentinel_does_not_keep_a_dropped_model(tmp_path: pathlib.Path, check: str,
                                                       keep_optimizer: bool) -> None:
    """A sentinel kept in a list of callbacks: dropping the model frees the model, its modules
    and (without the optimizer) its parameters; the sentinel closes itself quietly, with every
    step on disk, and reads as detached."""
    callbacks = []
    sentinel, model, part, kept_optimizer = _train_and_keep_sentinel(tmp_path, check, keep_optimizer)
    callbacks.append(sentinel)
    del sentinel
    gc.collect()
    assert model() is None and part() is None
    kept = callbacks[0]
    assert not kept.attached
    assert torch.autograd.backward is ORIGINAL_BACKWARD  # its patches went with the model
    kept.detach()  # a no-op now
    assert kept.step == 7
    assert kept.report().steps == 7
    assert "detached" in repr(kept)
    with pytest.raises(torch_sentinel.SentinelError, match=r"(?s)was garbage-collected.*keep a reference to the model"):
        kept.root  # noqa: B018
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss/train")] == list(range(7))
    if kept_optimizer is not None:
        # The kept optimizer still works on its own (its parameters are its own).
        kept_optimizer.step()  # type: ignore[attr-defined]
