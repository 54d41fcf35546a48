"""The spawn harness itself: a rank that dies in C++ must fail the run with its stderr unless
every rank had already written its results (then the run stands, with a warning)."""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from distributed.harness import by_name, completed, run_ranks

THIS = "distributed.test_harness"


def abort_on_rank1(rank: int, result: dict[str, Any], kw: dict[str, Any]) -> None:
    result["ran"] = True
    if rank == 1:
        print("gloo-like message from rank 1", file=sys.stderr, flush=True)
        os.abort()


def abort_at_exit_on_rank1(rank: int, result: dict[str, Any], kw: dict[str, Any]) -> None:
    result["ran"] = True
    if rank == 1:
        atexit.register(os.abort)  # runs after the results are written and the group is gone


def test_a_rank_that_aborts_mid_run_fails_the_run_with_its_stderr(tmp_path: Path) -> None:
    plan = [("abort", f"{THIS}:abort_on_rank1", {})]
    with pytest.raises(RuntimeError, match=r"(?s)SIGABRT before every rank wrote.*gloo-like message"):
        run_ranks(tmp_path, plan, world=2, timeout_s=90)


def test_a_rank_that_aborts_in_teardown_leaves_the_results_standing(tmp_path: Path) -> None:
    plan = [("exit", f"{THIS}:abort_at_exit_on_rank1", {})]
    with pytest.warns(RuntimeWarning, match="SIGABRT in teardown"):
        per_rank = run_ranks(tmp_path, plan, world=2, timeout_s=90)
    assert [r["ran"] for r in completed(by_name(per_rank, plan), "exit")] == [True, True]
