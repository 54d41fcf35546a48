"""``python -m benchmarks.replicas`` runs end to end on 2 gloo ranks (tiny model) and writes
well-formed results. Nothing asserts on a timing: on a shared machine they mean nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_replicas_benchmark_runs_and_writes_results(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.replicas", "--tiny", "--rounds", "2", "--steps", "12",
         "--check-every", "4", "--agreement-steps", "4", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "replicas-cpu-tiny.json").read_text())
    one, cadence, points = results["one_check"], results["cadence"], results["agreement"]
    assert one["tensors"] == 16 and one["parameters"] > 0
    assert set(one["median_ms"]) == {"check", "check_with_adamw_state", "megatron", "fingerprints", "sha1",
                                     "floor"}
    assert all(v > 0 for v in one["median_ms"].values())
    assert 0 < one["launches"] < 10 * one["tensors"]
    assert points["allreduce_16b_ms"] > 0 and points["steps"] == 4
    estimate = results["gpu_estimate"]
    assert estimate["7b_bf16"]["ratio"] > estimate["benchmark_model"]["ratio"] > 0
    assert cadence["checks_timed"] == 3  # paired steps 5..16 with a check every 4: 8, 12, 16
    md = (tmp_path / "replicas-cpu-tiny.md").read_text()
    assert "Megatron-style: CPU copy + SHA-1 + all-gather" in md and "share at every 200" in md
    assert "ESTIMATE for a GPU" in md and "one point ms" in md
