"""The lockstep point on 4 real gloo ranks: the cross-rank agreement and the replica check run
their collectives at training forwards, which every rank runs alike whatever its loop does with
``optimizer.step()`` (``torch_sentinel/_lockstep.py``).

The first test is the regression of the agreement's old place, the end of ``optimizer.step()``:
a rank that skipped one step made gloo abort the job there (``op.preamble.length <= op.nbytes``)
and NCCL hang. It runs in its own spawn, with a timeout, so that a crash or a hang fails it alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from distributed.harness import by_name, completed, run_ranks
from distributed.replica_scenarios import WORLD

#: Two spawns of 4 interpreters that import torch, then short scenarios: ~40-60 s on 2 cores.
pytestmark = pytest.mark.slow

S = "distributed.lockstep_scenarios:"
#: A hang is killed after this long (gloo's own timeout in the workers is 60 s).
TIMEOUT_S = 120


def test_a_rank_that_skips_a_step_leaves_no_rank_in_a_mismatched_collective(tmp_path: Path) -> None:
    # The previous repro: DDP on 4 gloo ranks, attach(model, opt) with the defaults (NaN
    # agreement on), rank 1 skips optimizer.step() at step 3; a check every 3 steps finds it.
    plan = [("skip", S + "ddp", {"skip": 1, "skip_at": 3, "attach": {"replica_check_every": 3}})]
    per_rank = run_ranks(tmp_path, plan, world=WORLD, timeout_s=TIMEOUT_S)
    for r in completed(by_name(per_rank, plan), "skip"):
        assert r["raised"] == "replica" and r["rank_blamed"] == 1, r
        assert r["step"] == 6 and r["evidence"]["steps"] == {"0": 6, "1": 5, "2": 6, "3": 6}
        assert r["at"] == (5 if r["rank"] == 1 else 6)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("lockstep")
    plan = [
        ("accumulation-nan", S + "ddp", {"micro": 4, "nan": 2, "nan_at": 3, "nan_micro": 1, "steps": 8}),
        ("accumulation-cadence", S + "ddp", {"micro": 4, "flip": 1, "flip_at": 4,
                                             "attach": {"replica_check_every": 3}}),
        ("skip-then-nan", S + "ddp", {"skip": 1, "skip_at": 2, "nan": 3, "nan_at": 4}),
        ("eval-on-rank0", S + "ddp", {"eval_every": 2, "nan": 1, "nan_at": 5,
                                      "attach": {"replica_check_every": 3}}),
        ("nan-at-last-step", S + "ddp", {"nan": 2, "nan_at": 7, "steps": 8}),
        ("final-check", S + "ddp", {"flip": 3, "flip_at": 10, "attach": {"replica_check_every": 3}}),
        ("submodules-only", S + "submodules_only", {"nan": 1, "nan_at": 3, "steps": 8}),
    ]
    return by_name(run_ranks(root, plan, world=WORLD, timeout_s=TIMEOUT_S), plan)


def test_accumulation_raises_at_the_next_micro_batch_before_the_update(runs: dict[str, Any]) -> None:
    # NaN in rank 2's second micro-batch of step 3: every rank raises at the third micro-batch's
    # forward, still inside step 3, before optimizer.step() could apply a NaN update.
    for r in completed(runs, "accumulation-nan"):
        assert r["raised"] == "nonfinite" and r["step"] == 3 and r["rank_blamed"] == 2
        assert r["boundary"] == "data" and "on rank 2" in r["message"]
        assert r["at"] == 3 and r["last_step"] == 2
        assert r["finite_weights"]
        assert r["our_frames"] <= 2  # the lockstep hook's entry, not the agreement's insides


def test_accumulation_counts_optimizer_steps_for_the_replica_check(runs: dict[str, Any]) -> None:
    # 4 micro-batches a step, a check every 3 steps: checks at steps 0, 3, 6 (counting forwards,
    # they would come every 3 micro-batches), so a flip after step 4's update is found at 6.
    for r in completed(runs, "accumulation-cadence"):
        assert r["raised"] == "replica" and r["rank_blamed"] == 1 and r["parameter"] == "fc1.weight"
        assert r["step"] == 6 and r["evidence"]["last_agreeing_step"] == 3


def test_a_skipped_step_then_a_nan_names_the_faulty_ranks_step_everywhere(runs: dict[str, Any]) -> None:
    # Rank 1 skipped step 2, so its step count is one behind; the NaN in rank 3's batch at step
    # 4 is raised by every rank at the next forward, as step 4 (rank 3's numbering).
    for r in completed(runs, "skip-then-nan"):
        assert r["raised"] == "nonfinite" and r["step"] == 4 and r["rank_blamed"] == 3
        assert r["boundary"] == "data"
        assert r["at"] == (4 if r["rank"] == 1 else 5) and r["last_step"] == 4


def test_evaluation_forwards_under_no_grad_on_one_rank_are_not_points(runs: dict[str, Any]) -> None:
    for r in completed(runs, "eval-on-rank0"):
        assert r["raised"] == "nonfinite" and r["step"] == 5 and r["rank_blamed"] == 1
        assert r["at"] == 6 and r["last_step"] == 5
        assert r["replica_findings"] == []  # checks at 0 and 3 agreed


def test_a_nan_at_the_last_step_is_raised_by_report_on_every_rank(runs: dict[str, Any]) -> None:
    for r in completed(runs, "nan-at-last-step"):
        assert "raised" not in r and r["last_step"] == 7
        assert r["report_raised"] and r["step"] == 7 and r["rank_blamed"] == 2 and r["boundary"] == "data"
        assert "non_finite" in r["kinds"]


def test_report_runs_a_last_replica_check_and_records_it(runs: dict[str, Any]) -> None:
    # Checks at steps 0, 3, 6, 9; the flip after step 10's update comes after the last one.
    for r in completed(runs, "final-check"):
        assert "raised" not in r and r["last_step"] == 11
        (finding,) = r["replica_findings"]
        assert finding["rank"] == 3 and r["report_warned"] == 1
        ev = finding["evidence"]
        assert ev["parameter"] == "fc1.weight" and ev["chunk"][0] <= 123 < ev["chunk"][1]
        assert (ev["first_seen_step"], ev["last_agreeing_step"]) == (12, 9)


def test_a_loop_that_never_calls_the_model_agrees_at_row_closes(runs: dict[str, Any]) -> None:
    # No training forward of the attached model: the agreement runs at the end of each
    # optimizer.step(), so every rank raises inside step 3's step() (last_step stays 2).
    for r in completed(runs, "submodules-only"):
        assert r["raised"] == "nonfinite" and r["step"] == 3 and r["rank_blamed"] == 1
        assert r["at"] == 4 and r["last_step"] == 2
