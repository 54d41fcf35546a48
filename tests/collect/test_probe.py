"""The probe protocol: a newcomer's probe written against it, scheduled, and switched off on a bug."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import pytest
import torch
from helpers import MLP, make_batch
from torch import nn

import torch_sentinel
from torch_sentinel._collect.collector import Collector
from torch_sentinel._collect.probe import EVENTS, Probe, ProbeHost, overrides
from torch_sentinel._record import StepMeta, StepRecord


class HeadMean(Probe):
    """Reserves one slot, fills it with the mean of the head's output, counts the events."""

    name = "head_mean"

    def __init__(self) -> None:
        self.events: list[str] = []

    def setup(self, host: ProbeHost) -> None:
        self.host = host
        self.slot = host.ledger.add_block("head_mean", ["mean"]).start

    def output_modules(self, host: ProbeHost) -> Iterable[nn.Module]:
        return [m for n, m in host.map.modules if n == "head"]

    def on_root_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.events.append("root")

    def on_output(self, slot: int, module: nn.Module, args: Any, t: torch.Tensor, compiling: bool) -> None:
        self.events.append(f"out:{self.host.module_names[slot]}")
        with torch.no_grad():
            self.host.ledger.views[self.slot].copy_(t.detach().mean())

    def on_backward(self, loss: torch.Tensor) -> None:
        self.events.append("backward")

    def on_pre_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.events.append("pre")

    def on_post_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.events.append("post")

    def on_row_close(self, meta: StepMeta) -> None:
        self.events.append("close")


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    opt.zero_grad()
    out = model(x)
    nn.functional.cross_entropy(out, y).backward()
    opt.step()
    return out


def test_a_probe_gets_its_events_in_step_order_and_its_slot_reaches_the_record() -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    records: list[StepRecord] = []
    c = Collector(model, [opt], immediate=False, update_every=0, on_record=records.append)
    probe = HeadMean()
    c.add_probe(probe)
    c.add_probe(probe)  # added once
    c.install()
    x, y = make_batch("mlp", generator=torch.Generator().manual_seed(1))
    try:
        out = _step(model, opt, x, y)
        c.drain(block=True)
    finally:
        c.close()
    assert probe.events == ["root", "out:head", "backward", "pre", "post", "close"]
    assert records[0].value("head_mean", "mean") == pytest.approx(out.detach().mean().item(), rel=1e-6)


def test_only_overridden_events_are_scheduled() -> None:
    assert [e for e in EVENTS if overrides(HeadMean(), e)] == [
        "on_root_inputs", "on_output", "on_backward", "on_pre_step", "on_post_step", "on_row_close"]


class Broken(Probe):
    name = "broken"

    def __init__(self) -> None:
        self.calls = 0

    def on_backward(self, loss: torch.Tensor) -> None:
        self.calls += 1
        raise ValueError("a bug in a probe")


def test_a_probe_that_raises_is_switched_off_with_one_warning_and_training_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    torch.manual_seed(0)
    model = MLP()
    reference = MLP()
    reference.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    broken = Broken()
    g = torch.Generator().manual_seed(2)
    batches = [make_batch("mlp", generator=g) for _ in range(3)]
    with caplog.at_level(logging.WARNING, logger="torch_sentinel"), torch_sentinel.attach(model, opt) as sentinel:
        sentinel._collector.add_probe(broken)
        for x, y in batches:
            _step(model, opt, x, y)
        records = sentinel.recent_records()
    for x, y in batches:
        _step(reference, ref_opt, x, y)
    assert broken.calls == 1
    assert [r.message for r in caplog.records].count(
        "torch_sentinel: probe broken failed and is switched off (ValueError: a bug in a probe); training goes on") == 1
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)
    assert [r.meta.backward_calls for r in records] == [1, 1, 1]
