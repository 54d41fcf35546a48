"""build_sinks and log-directory failures: training keeps going, with one clear warning."""

from __future__ import annotations

import resource
import signal
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from helpers import MLP, make_batch
from torch import nn

import torch_sentinel
from torch_sentinel.sinks import SinkContext, build_sinks


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, nan_at: int = -1) -> int:
    g = torch.Generator().manual_seed(0)
    done = 0
    for step in range(steps):
        x, y = make_batch("mlp", generator=g)
        if step == nan_at:
            x[0, 0] = float("nan")
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        done += 1
    return done


@pytest.mark.parametrize(
    ("log_dir", "is_writer", "expected"),
    [
        (None, True, ["ConsoleSink"]),
        ("run", True, ["ConsoleSink", "JsonlSink", "TensorBoardSink", "PrecisionFileSink"]),
        ("run", False, ["ConsoleSink"]),
    ],
    ids=["no_log_dir", "writer_rank", "other_rank"],
)
def test_build_sinks(
    tmp_path: Path, log_dir: str | None, is_writer: bool, expected: list[str]
) -> None:
    ctx = SinkContext(
        log_dir=str(tmp_path / log_dir) if log_dir else None,
        log_every=1,
        rank=None,
        is_writer=is_writer,
    )
    sinks = build_sinks(ctx)
    try:
        assert [type(s).__name__ for s in sinks] == expected
    finally:
        for s in sinks:
            s.close()


def test_unwritable_log_dir_sinks_warn_once(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    ctx = SinkContext(log_dir=str(blocker / "run"), log_every=1, rank=None, is_writer=True)
    with pytest.warns(RuntimeWarning, match="cannot write to log_dir") as caught:
        sinks = build_sinks(ctx)
    assert [type(s).__name__ for s in sinks] == ["ConsoleSink"]
    assert len([w for w in caught if "log_dir" in str(w.message)]) == 1


def test_unwritable_log_dir_warns_once_and_training_continues(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sentinel = torch_sentinel.attach(
            model, opt, log_dir=str(blocker / "run"), on_nonfinite="record", check="deferred"
        )
        assert train(model, opt, 6, nan_at=3) == 6
        report = sentinel.report()
        sentinel.detach()
    ours = [w for w in caught if "cannot write to log_dir" in str(w.message)]
    assert len(ours) == 1
    assert ours[0].category is RuntimeWarning
    assert "sentinel.report()" in str(ours[0].message)
    assert report.kinds() >= {"non_finite"}


@contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Make every write past ``limit`` bytes fail with EFBIG, as a full disk fails with ENOSPC."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs POSIX file size limits")
# TensorBoard's own event-writer thread re-raises the OSError as it dies; our sink catches it
# at the next write, which is what the test checks.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_full_disk_mid_run_warns_once_and_findings_stay_in_report(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sentinel = torch_sentinel.attach(
        model, opt, log_dir=str(tmp_path), flush_every=2, on_nonfinite="record", check="deferred"
    )
    train(model, opt, 4)
    sentinel.flush()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # Files already hold more than this, so every further write fails.
        with file_size_limit(64):
            assert train(model, opt, 8, nan_at=2) == 8
            report = sentinel.report()
            sentinel.detach()
    ours = [w for w in caught if "cannot write to log_dir" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert "report()" in str(ours[0].message)
    assert "non_finite" in report.kinds()
    # The write of the finding was cut at the limit: no complete line reached the file.
    assert "\n" not in (tmp_path / "findings.jsonl").read_text()
