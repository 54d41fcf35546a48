"""Rank-consistent raise, DDP naming, rank-0 logging and cross-rank reports on 2 real gloo ranks."""

from __future__ import annotations

from typing import Any

import pytest
from distributed.harness import by_name, completed, run_ranks
from distributed.rank_sync_scenarios import WORLD

TIMEOUT_S = 90


# ---------------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("ranks")
    plan = [
        ("nan-batch-immediate", "nan_at_step3",
         {"log_dir": str(root / "nan-batch"), "check": "immediate", "where": "data"}),
        ("inf-forward-deferred", "nan_at_step3",
         {"log_dir": str(root / "inf-forward"), "check": "deferred", "where": "forward"}),
        ("nan-batch-lagged", "nan_at_step3",
         {"log_dir": str(root / "nan-lagged"), "check": "deferred", "where": "data", "lag": 1}),
        ("rank0-only", "healthy", {"log_dir": str(root / "rank0-only"), "per_rank": False}),
        ("per-rank", "healthy", {"log_dir": str(root / "per-rank"), "per_rank": True}),
        ("gather", "gather", {}),
        ("fsdp", "fsdp_norms", {}),
    ]
    per_rank = run_ranks(root, plan, world=WORLD, timeout_s=TIMEOUT_S,
                         default_module="distributed.rank_sync_scenarios")
    return {"root": root, **by_name(per_rank, plan)}


@pytest.mark.parametrize(
    ("name", "boundary", "module"),
    [("nan-batch-immediate", "data", None), ("inf-forward-deferred", "forward", "gate")],
    ids=["nan-batch-immediate", "inf-forward-deferred"],
)
def test_every_rank_raises_at_the_faulty_step(runs: dict[str, Any], name: str, boundary: str,
                                             module: Any) -> None:
    for r in completed(runs, name):
        assert r.get("raised"), f"rank {r['rank']} did not raise: {r}"
        assert r["step"] == 3
        assert r["at"] == 4  # both raised at step 4's training forward (the next lockstep point)
        assert r["last_step"] == 3
        assert r["rank_blamed"] == 1
        assert r["boundary"] == boundary
        assert r["module"] == module
        assert "on rank 1" in r["message"].splitlines()[0]
        assert not any(n.startswith("module") for n in r["module_names"])
        assert "gate" in r["module_names"]
        assert "non_finite" in r["report_kinds"] and r["report_ranks"] == [1]


def test_the_accelerator_read_path_raises_one_point_later_naming_the_same_step(runs: dict[str, Any]) -> None:
    # The agreement issued at step 4's forward is read at step 5's (its copy has landed there).
    for r in completed(runs, "nan-batch-lagged"):
        assert r.get("raised") and r["step"] == 3 and r["rank_blamed"] == 1 and r["boundary"] == "data"
        assert r["at"] == 5 and r["last_step"] == 4


@pytest.mark.parametrize("name", ["nan-batch-immediate", "rank0-only"], ids=["faulty", "healthy"])
def test_only_rank0_writes_logs_by_default(runs: dict[str, Any], name: str) -> None:
    completed(runs, name)
    logs = runs["root"] / ("nan-batch" if name == "nan-batch-immediate" else name)
    written = sorted(p.name for p in logs.iterdir())
    assert written and not any(n.startswith("rank") for n in written)


def test_per_rank_logs_write_one_run_per_rank(runs: dict[str, Any]) -> None:
    completed(runs, "per-rank")
    logs = runs["root"] / "per-rank"
    assert sorted(p.name for p in logs.iterdir()) == ["rank0", "rank1"]
    assert all(any((logs / d).iterdir()) for d in ("rank0", "rank1"))


@pytest.mark.parametrize("name", ["rank0-only", "per-rank"], ids=["rank0-only", "per-rank"])
def test_healthy_ddp_is_quiet_and_adds_no_host_reads(runs: dict[str, Any], name: str) -> None:
    for r in completed(runs, name):
        assert r["ok"], r["findings"]
        assert r["sentinel_syncs"] == r["bare_syncs"]


def test_report_gathers_findings_from_every_rank(runs: dict[str, Any]) -> None:
    for r in completed(runs, "gather"):
        assert r["kinds"] == ["everywhere", "only_on_rank0", "only_on_rank1"]


def test_fsdp2_norms_equal_full_parameter_norms(runs: dict[str, Any]) -> None:
    for r in completed(runs, "fsdp"):
        assert r["local_shape"] == [8, 8]  # each rank really holds half of fc1.weight
        assert r["ok"], r["findings"]
        assert len(r["recorded"]) == len(r["expected"]) == 3
        for got, want in zip(r["recorded"], r["expected"]):
            for block in ("grad_norm", "param_norm", "update_norm"):
                assert got[block].keys() == want[block].keys()
                for name, value in want[block].items():
                    assert got[block][name] == pytest.approx(value, rel=1e-4, abs=1e-6), (block, name)
