"""Replica divergence on 4 real gloo ranks under DDP (and HSDP/FSDP2), one spawn for all.

Each fault is injected on one rank after a step's update; with checks at the start of steps
0, 3, 6 and 9, every fault at step 4 or 5 must be found at step 6, on every rank, naming the
rank, the parameter and a chunk of at most 128 elements holding the corrupted element.
"""

from __future__ import annotations

from typing import Any

import pytest
from distributed.harness import by_name, completed, run_ranks
from distributed.replica_scenarios import TIMEOUT_S, WORLD

#: One spawn of 4 interpreters that import torch, then ~15 short scenarios: ~30-50 s on 2 cores.
pytestmark = pytest.mark.slow

FC1 = {"parameter": "fc1.weight"}

FAULTS: dict[str, dict[str, Any]] = {
    # an exponent MSB flip makes the value ~1e37: injected right before a check (step 5), so
    # that no forward runs on it first (it would overflow, and the NaN agreement would raise)
    "exponent-msb-flip": {"fault": "flip", "bad": 1, "at": 5, **FC1, "index": 20000, "bit": 30},
    "mantissa-lsb-flip": {"fault": "flip", "bad": 2, "at": 4, **FC1, "index": 777, "bit": 0},
    # with the defaults (sync_ranks=True): the agreement's collective runs at training
    # forwards, which the rank that skipped step() runs like the others
    "skipped-step": {"fault": "skip", "bad": 1, "at": 4},
    "grad-after-allreduce": {"fault": "grad", "bad": 3, "at": 4, **FC1, "index": 31000},
    "unused-parameter": {"fault": "add", "bad": 0, "at": 4, "parameter": "spare", "index": 500},
    "adam-moment": {"fault": "add", "bad": 2, "at": 5, "parameter": "fc2.weight", "state": "exp_avg",
                    "index": 1000},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("replicas")
    plan = [(name, "ddp_fault", kw) for name, kw in FAULTS.items()] + [
        ("warn", "ddp_fault", {"fault": "flip", "bad": 1, "at": 4, "parameter": "fc2.bias", "index": 2,
                               "bit": 0, "on_divergence": "warn"}),
        ("tolerance", "ddp_fault", {"fault": "grad", "bad": 2, "at": 20, **FC1, "index": 5, "every": 1,
                                    "replica_check": "tolerance", "noise": 1e-7, "steps": 24}),
        ("nan-with-check", "ddp_fault", {"fault": "nan", "bad": 1, "at": 3, "every": 1}),
        ("check-fails", "check_fails_on_one_rank", {"fault": "flip", "bad": 2, "at": 4, **FC1,
                                                    "index": 0, "bit": 0}),
        ("sync-audit", "sync_audit", {}),
        ("unwrapped", "unwrapped", {"fault": "flip", "at": 4, **FC1, "index": 10, "bit": 0}),
        ("hsdp", "fsdp", {"hsdp": True, "every": 3, "fault": "flip", "bad": 3, "at": 4, **FC1,
                          "index": 4000, "bit": 0}),
        ("fsdp", "fsdp", {"hsdp": False, "fault": "flip", "bad": 3, "at": 4, **FC1, "index": 4000,
                          "bit": 0}),
    ]
    per_rank = run_ranks(root, plan, world=WORLD, timeout_s=TIMEOUT_S,
                         default_module="distributed.replica_scenarios")
    return by_name(per_rank, plan)


def _raised_everywhere(results: list[dict[str, Any]], step: int, bad: int) -> None:
    for r in results:
        assert r.get("raised") == "replica", f"rank {r['rank']} did not raise: {r}"
        assert r["step"] == step and r["rank_blamed"] == bad and r["ranks"] == [bad]
        assert r["evidence"]["first_seen_step"] == step
    assert len({r["message"] for r in results}) == 1  # the same verdict on every rank


def _chunk_holds_the_difference(results: list[dict[str, Any]], bad: int) -> tuple[int, int]:
    lo, hi = results[0]["chunk"]
    assert 0 < hi - lo <= 128
    reference = next(r for r in results if r["rank"] != bad)
    assert results[bad]["values"] != reference["values"]  # the chunk really differs there
    return lo, hi


@pytest.mark.parametrize("name", list(FAULTS), ids=list(FAULTS))
def test_fault_found_at_first_check_naming_rank_parameter_and_chunk(runs: dict[str, Any], name: str) -> None:
    kw = FAULTS[name]
    results = completed(runs, name)
    bad = kw["bad"]
    _raised_everywhere(results, 6, bad)
    for r in results:
        assert r["evidence"]["last_agreeing_step"] == 3
        assert r["evidence"]["mode"] == "exact"
        assert r["at"] == (5 if name == "skipped-step" and r["rank"] == bad else 6)
        assert r["parameter"] == kw.get("parameter", "fc1.weight")
        assert r["state"] == kw.get("state")
        assert r["module"] == {"fc1.weight": "fc1", "fc2.weight": "fc2", "spare": None}[r["parameter"]]
        assert f"rank {bad}" in r["message"].splitlines()[0]
        assert [f["rank"] for f in r["findings"]] == [bad]  # in report(), severity error
        assert r["findings"][0]["severity"] == "error" and r["findings"][0]["boundary"] == "updates"
    lo, hi = _chunk_holds_the_difference(results, bad)
    if "index" in kw:
        assert lo <= kw["index"] < hi


def test_skipped_step_is_named_in_the_message(runs: dict[str, Any]) -> None:
    for r in completed(runs, "skipped-step"):
        assert r["evidence"]["steps"] == {"0": 6, "1": 5, "2": 6, "3": 6}
        assert "rank 1 completed 5 optimizer steps" in r["message"]
        assert "skipped optimizer.step()" in r["message"]


def test_grad_corruption_also_shows_in_the_adam_state(runs: dict[str, Any]) -> None:
    evidence = completed(runs, "grad-after-allreduce")[0]["evidence"]
    assert evidence["differing"] >= 3
    assert {"fc1.weight:exp_avg", "fc1.weight:exp_avg_sq"} <= set(evidence["others"])


def test_adam_moment_alone_is_found(runs: dict[str, Any]) -> None:
    for r in completed(runs, "adam-moment"):
        assert r["evidence"]["state"] == "exp_avg" and r["evidence"]["differing"] == 1
        assert "holds another optimizer state 'exp_avg' of fc2.weight" in r["message"]


def test_unused_parameter_names_the_root_and_the_majority(runs: dict[str, Any]) -> None:
    for r in completed(runs, "unused-parameter"):
        assert r["evidence"]["reference_ranks"] == [1, 2, 3] and r["evidence"]["majority"]
        assert "module (root), parameter spare" in r["message"]


def test_warn_records_once_and_goes_on(runs: dict[str, Any]) -> None:
    for r in completed(runs, "warn"):
        assert "raised" not in r and r["last_step"] == 11
        assert r["warned"] == 1  # checks at 6 and 9 both see it: warned once
        (finding,) = r["findings"]
        ev = finding["evidence"]
        assert finding["rank"] == 1 and finding["module"] == "fc2"
        assert ev["parameter"] == "fc2.bias" and ev["ranks"] == [1] and ev["chunk"][0] <= 2 < ev["chunk"][1]
        assert (ev["first_seen_step"], ev["last_agreeing_step"], ev["mode"]) == (6, 3, "exact")


def test_tolerance_ignores_benign_noise_and_finds_the_fault(runs: dict[str, Any]) -> None:
    results = completed(runs, "tolerance")
    _raised_everywhere(results, 21, 2)  # checked at every step: quiet through step 20
    for r in results:
        ev = r["evidence"]
        assert ev["mode"] == "tolerance" and ev["last_agreeing_step"] == 20
        assert ev["deviation"] > ev["rtol"] == 1e-5
        assert ev["chunk"][0] <= 5 < ev["chunk"][1]


def test_nan_agreement_still_raises_first(runs: dict[str, Any]) -> None:
    for r in completed(runs, "nan-with-check"):
        assert r["raised"] == "nonfinite" and r["step"] == 3 and r["rank_blamed"] == 1
        assert "replica_divergence" not in r["kinds"]


def test_check_failing_on_one_rank_switches_off_everywhere_without_hanging(runs: dict[str, Any]) -> None:
    for r in completed(runs, "check-fails"):
        assert "raised" not in r and r["last_step"] == 11
        assert any("switched off on every rank" in line and "rank(s) 1" in line for line in r["log"])
        assert r["findings"] == []  # the later flip goes unseen: the check is off, and says so


def test_steps_without_a_check_add_no_host_reads_and_no_device_work(runs: dict[str, Any]) -> None:
    for r in completed(runs, "sync-audit"):
        assert len(set(r["bare"])) == 1
        for i, ((syncs_off, ops_off), (syncs_on, ops_on)) in enumerate(zip(r["off"], r["on"])):
            if i % 4:
                assert syncs_on == syncs_off == r["bare"][0], i
                assert ops_on == ops_off, i  # between checks: not one device op added
            else:
                assert ops_on > ops_off, i  # the check runs at steps 0, 4, 8, and only there


def test_unwrapped_model_is_compared_only_when_asked(runs: dict[str, Any]) -> None:
    for r in completed(runs, "unwrapped"):
        assert "raised" not in r["default"] and r["default"]["last_step"] == 11
        assert r["explicit"]["raised"] == "replica" and r["explicit"]["rank_blamed"] == 1
        assert r["explicit"]["step"] == 6


def test_hsdp_compares_along_the_replicate_dimension(runs: dict[str, Any]) -> None:
    results = completed(runs, "hsdp")
    assert all(r["local_shape"] == [256, 64] for r in results)
    _raised_everywhere(results, 6, 3)  # ranks 0 and 2 (another replica group) raise too
    ev = results[0]["evidence"]
    assert ev["reference_ranks"] == [1] and not ev["majority"]  # two replicas: no majority
    assert ev["chunk"][0] <= 4000 < ev["chunk"][1]
    assert "no majority" in results[0]["message"]


def test_fully_sharded_parameters_are_skipped_with_one_info_finding(runs: dict[str, Any]) -> None:
    for r in completed(runs, "fsdp"):
        assert "raised" not in r and r["last_step"] == 11
        (finding,) = r["findings"]
        assert finding["severity"] == "info" and finding["evidence"]["count"] == 4

