"""``torch-sentinel report RUN | head``: a reader that closes early ends the command quietly, with
a shell's exit status for SIGPIPE, never a ``BrokenPipeError`` traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
ROOT = Path(__file__).resolve().parents[2]
SIGPIPE_STATUS = 141  # 128 + SIGPIPE, what a shell reports for `cat big | head`


def _runs(tmp_path: Path, count: int = 120) -> Path:
    """A directory of many runs: ``report`` prints each (about 1.4 kB apiece, past any pipe buffer)."""
    root = tmp_path / "runs"
    good = (GOLDEN / "report_run" / "findings.jsonl").read_text().splitlines()[:4]  # line 5 is bad on purpose
    for i in range(count):
        run = root / f"run{i:03d}"
        run.mkdir(parents=True)
        shutil.copy(GOLDEN / "report_run" / "manifest.json", run)
        (run / "findings.jsonl").write_text("\n".join(good) + "\n")
    return root


def _command(args: list[str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "torch_sentinel", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=ROOT)


@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_report_into_a_reader_that_reads_one_line(json_out: bool, tmp_path: Path) -> None:
    proc = _command(["report", *(["--json"] if json_out else []), str(_runs(tmp_path))])
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # `| head -1`
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == SIGPIPE_STATUS
    assert err == b""
    assert first.startswith(b"[" if json_out else b"run: ")


@pytest.mark.parametrize("args", [["report", "RUNS"], ["diff", "A", "B"], ["demo", "--only", "healthy", "--out", "OUT"]],
                         ids=["report", "diff", "demo"])
def test_every_subcommand_into_a_reader_already_gone(args: list[str], tmp_path: Path) -> None:
    runs = _runs(tmp_path, count=2)
    places = {"RUNS": runs, "A": runs / "run000", "B": runs / "run001", "OUT": tmp_path / "demo"}
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch_sentinel", *[str(places.get(a, a)) for a in args]],
                          stdout=write, stderr=subprocess.PIPE, env=env, cwd=ROOT, timeout=300)
    os.close(write)
    err = done.stderr.decode()
    assert done.returncode == SIGPIPE_STATUS, err
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err
    if args[0] != "demo":  # the demo's progress goes to stderr
        assert err == ""
