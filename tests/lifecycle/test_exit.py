"""Nothing lost: what a run leaves on disk when it ends without detach(), on an uncaught
NonFiniteError, and under kill -9. Every run is a user script in a fresh interpreter; the files
are read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import pathlib

import pytest
from userscript import (
    events,
    findings,
    manifest,
    readme_first_example,
    run_script,
    steps_of,
    value_at,
)


def test_readme_first_example_verbatim_loses_no_step(tmp_path: pathlib.Path) -> None:
    """attach() and an unchanged loop, no detach, no `with`: 130 steps (two full windows of 50
    and a last partial one). Every step reaches TensorBoard; the findings only the end of the
    run can produce reach findings.jsonl and the manifest's result."""
    snippet = readme_first_example()
    assert "torch_sentinel.attach(model, optimizer" in snippet and "detach" not in snippet
    proc = run_script(tmp_path, snippet, steps=130, scale_from=112)
    log_dir = tmp_path / "runs" / "exp"
    acc = events(log_dir)
    assert steps_of(acc, "loss/train") == list(range(130))
    assert steps_of(acc, "grad_norm/global") == list(range(130))
    rows = findings(log_dir)
    # The loss jumps at step 112: only the last window (steps 100-129) can show it; loss_spike
    # names the batch (inputs 30x larger from there).
    assert rows and {f["kind"] for f in rows} <= {"diverging", "plateau", "loss_spike"}
    assert all(f["evidence"]["cause"] == "bad_batch" for f in rows if f["kind"] == "loss_spike")
    assert "diverging" in {f["kind"] for f in rows}
    assert all(f["step"] >= 112 for f in rows)
    assert "diverging" in proc.stderr  # the console sink, at exit
    result = manifest(log_dir)["result"]
    assert result["steps"] == 130 and result["final_loss_step"] == 129
    assert result["findings"] == sorted({f["kind"] for f in rows})


@pytest.mark.parametrize("check", ["immediate", "deferred"], ids=["immediate", "deferred"])
def test_uncaught_nonfinite_error_leaves_every_row_up_to_the_bad_step(tmp_path: pathlib.Path, check: str) -> None:
    """The script dies of the NonFiniteError at step 37 (no flush_every boundary near it): the
    curves run up to and including step 37, with a nonfinite/* point there, and the finding is
    in findings.jsonl."""
    body = f"""
        import torch_sentinel
        sentinel = torch_sentinel.attach(model, optimizer, log_dir="run", check={check!r})
        for step, (x, y) in enumerate(loader):
            if step == 37:
                x[0, 0] = float("nan")
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    """
    proc = run_script(tmp_path, body, steps=80, expect_rc=1)
    assert "NonFiniteError: non-finite values first appeared at step 37" in proc.stderr
    acc = events(tmp_path / "run")
    assert steps_of(acc, "loss/train")[-1] >= 36
    assert steps_of(acc, "nonfinite/data")[-1] == 37
    assert value_at(acc, "nonfinite/data", 37) > 0
    assert value_at(acc, "nonfinite/data", 36) == 0
    rows = findings(tmp_path / "run")
    assert [(f["kind"], f["step"], f["boundary"]) for f in rows] == [("non_finite", 37, "data")]
    assert manifest(tmp_path / "run")["result"]["findings"] == ["non_finite"]


def test_kill_9_leaves_files_readable_up_to_the_last_flush(tmp_path: pathlib.Path) -> None:
    """SIGKILL: no atexit, no finally. The windows handed to TensorBoard's writer more than
    ``FLUSH_SECS`` before the kill (steps 0-99 with flush_every=50) read back intact, flushed
    by the writer's own thread (the training thread never flushed them); nothing half-written
    breaks the readers."""
    body = """
        import os, signal, time
        import torch_sentinel
        from torch_sentinel.sinks.tensorboard import TensorBoardSink
        sentinel = torch_sentinel.attach(model, optimizer, log_dir="run", flush_every=50)
        sentinel.note(symptom="started", hypothesis="none", change="none")
        for step, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        time.sleep(TensorBoardSink.FLUSH_SECS + 1.5)
        os.kill(os.getpid(), signal.SIGKILL)
    """
    run_script(tmp_path, body, steps=120, expect_rc=-9)
    acc = events(tmp_path / "run")
    assert steps_of(acc, "loss/train") == list(range(100))
    assert [r["kind"] for r in findings(tmp_path / "run")] == ["note"]
    assert manifest(tmp_path / "run")["model"]  # written at attach, atomically
