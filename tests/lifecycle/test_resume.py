"""Resume: attach(..., start_step=N) continues the step numbering, and Sentinel.state_dict() /
load_state_dict() carry the detectors' windows across a checkpoint, so a run interrupted and
resumed reports what the uninterrupted run reports."""

from __future__ import annotations

import io
import pathlib

import pytest
import torch
from helpers import MLP
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

import torch_sentinel
from torch_sentinel import SentinelError

STEPS, CUT, JUMP = 90, 45, 60


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    # From step JUMP the inputs are 100x larger (and the lr is 0, see _train): the loss climbs
    # far above the low it reached before the checkpoint and stays there, which only a detector
    # that kept its window can compare against. (Before issue 25: 30x at lr 0.05, a 5-step spike
    # the model recovered from; diverging now needs a climb held over two 5-step windows.)
    return [(torch.randn(16, 20, generator=g) * (100.0 if i >= JUMP else 1.0), torch.randint(0, 4, (16,), generator=g))
            for i in range(STEPS)]


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: range) -> None:
    data = _batches()
    for i in steps:
        x, y = data[i]
        for group in opt.param_groups:
            group["lr"] = 0.05 if i < JUMP else 0.0  # the schedule ends at lr 0: no recovery
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def _fresh() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = MLP()
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def _scalars(log_dir: pathlib.Path, tag: str) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_resumed_run_reports_what_the_uninterrupted_run_reports(tmp_path: pathlib.Path) -> None:
    model, opt = _fresh()
    with torch_sentinel.attach(model, opt, log_dir=str(tmp_path / "whole")) as whole:
        _train(model, opt, range(STEPS))
    expected = {(f.kind, f.step) for f in whole.report().findings if f.kind == "diverging"}
    kinds = {f.kind for f in whole.report().findings}
    assert expected, "the uninterrupted run must find the divergence"

    # First half, then a checkpoint as a user writes it (no detach: the process just ends).
    model, opt = _fresh()
    first = torch_sentinel.attach(model, opt, log_dir=str(tmp_path / "resumed"))
    _train(model, opt, range(CUT))
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "sentinel": first.state_dict()}, buf)
    first.detach()

    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)  # the state is plain data
    model, opt = _fresh()
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    second = torch_sentinel.attach(model, opt, log_dir=str(tmp_path / "resumed"))
    second.load_state_dict(ckpt["sentinel"])
    assert second.step == CUT
    _train(model, opt, range(CUT, STEPS))
    second.detach()
    # The same verdicts; the divergence at the same step (other verdicts may come at the end of
    # a different window: state_dict() flushes).
    assert {f.kind for f in second.report().findings} == kinds
    assert {(f.kind, f.step) for f in second.report().findings if f.kind == "diverging"} == expected
    # One TensorBoard run, steps 0..89 once each, with the values of the uninterrupted run.
    resumed, whole_run = _scalars(tmp_path / "resumed", "loss/train"), _scalars(tmp_path / "whole", "loss/train")
    assert [step for step, _ in resumed] == [step for step, _ in whole_run] == list(range(STEPS))
    assert [v for _, v in resumed] == pytest.approx([v for _, v in whole_run])


def test_start_step_continues_numbering_without_a_state(tmp_path: pathlib.Path) -> None:
    model, opt = _fresh()
    with torch_sentinel.attach(model, opt, log_dir=str(tmp_path), start_step=1000) as s:
        assert s.step == 1000
        _train(model, opt, range(3))
        assert s.step == 1003
    assert [step for step, _ in _scalars(tmp_path, "loss/train")] == [1000, 1001, 1002]


def test_load_state_dict_is_checked() -> None:
    model, opt = _fresh()
    with torch_sentinel.attach(model, opt) as s:
        with pytest.raises(SentinelError, match=r"not a sentinel state(.|\n)*checkpoint\['sentinel'\]"):
            s.load_state_dict(model.state_dict())
        state = s.state_dict()
        _train(model, opt, range(2))
        with pytest.raises(SentinelError, match=r"after steps were recorded(.|\n)*before the training loop"):
            s.load_state_dict(state)
