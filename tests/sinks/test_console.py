"""ConsoleSink: one log line per finding on the "torch_sentinel" logger, rate-limited."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from helpers import MLP, make_batch
from torch import nn

import torch_sentinel
from torch_sentinel import Finding
from torch_sentinel.sinks import SinkContext
from torch_sentinel.sinks.console import ConsoleSink


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ctx() -> SinkContext:
    return SinkContext(log_dir=None, log_every=1, rank=None, is_writer=True)


def finding(i: int, severity: Any = "warning") -> Finding:
    return Finding(
        kind="dead_relu",
        boundary="forward",
        module=f"layer{i}",
        step=i,
        message="units never fire",
        severity=severity,
    )


@pytest.mark.parametrize(
    ("severity", "level"),
    [("error", logging.ERROR), ("warning", logging.WARNING), ("info", logging.INFO)],
    ids=["error", "warning", "info"],
)
def test_one_line_per_finding_at_its_severity(
    caplog: pytest.LogCaptureFixture, severity: str, level: int
) -> None:
    caplog.set_level(logging.INFO, logger="torch_sentinel")
    ConsoleSink(ctx()).write([], [finding(0, severity), finding(1, severity)])
    records = [r for r in caplog.records if r.name == "torch_sentinel"]
    assert [r.levelno for r in records] == [level, level]
    assert "dead_relu (forward) in layer0 at step 0: units never fire" in records[0].getMessage()
    assert ("-> next: inspect_initialization_and_learning_rate" in records[0].getMessage()) == (
        severity != "info"
    )


def test_multiline_message_is_folded_into_one_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="torch_sentinel")
    f = Finding(
        kind="non_finite", boundary="loss", message="NaN loss\n  expected: finite\n  next: x"
    )
    ConsoleSink(ctx()).write([], [f])
    (record,) = caplog.records
    assert "\n" not in record.getMessage()
    assert "NaN loss; expected: finite; next: x" in record.getMessage()


def test_rate_limit_holds_back_and_counts(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="torch_sentinel")
    clock = Clock()
    sink = ConsoleSink(ctx(), per_minute=3, clock=clock)
    sink.write([], [finding(i) for i in range(5)])
    assert len(caplog.records) == 3
    clock.now += 61.0
    sink.write([], [finding(5)])
    assert len(caplog.records) == 4
    assert "2 earlier line(s) held back" in caplog.records[-1].getMessage()
    sink.write([], [finding(i) for i in range(6, 10)])  # 2 more go out, 2 are held back
    sink.close()
    assert "2 more line(s) were held back" in caplog.records[-1].getMessage()


def test_real_run_logs_the_nonfinite_finding_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="torch_sentinel")
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    with torch_sentinel.attach(model, opt, on_nonfinite="record", check="deferred"):
        for step in range(6):
            x, y = make_batch("mlp", generator=g)
            if step >= 2:
                x[0, 0] = float("nan")  # every later step is bad too: still one line
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    lines = [r.getMessage() for r in caplog.records if "non_finite" in r.getMessage()]
    assert len(lines) == 1
    assert "at step 2" in lines[0] and "(data)" in lines[0]
