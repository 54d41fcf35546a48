"""``python -m benchmarks.fixed_cost --quick`` runs end to end and writes the four figures with
the floor beside them. Nothing asserts on a timing: on a shared machine they mean nothing; the
counts (launches, Python calls) are exact and are checked for what they must be."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_fixed_cost_benchmark_runs_and_writes_results(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.fixed_cost", "--quick", "--models", "stack10",
         "--calls-models", "stack10", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "fixed-cost-cpu.json").read_text())
    timing = results["timing"]["stack10"]
    assert set(timing) >= {"bare", "empty_hooks", "collection", "sentinel", "sentinel_tb"}
    assert timing["floor_hooks"] >= 3  # the output node's pre-hook and the optimizer's two
    assert all(timing[v]["median_ms"] > 0 for v in ("bare", "empty_hooks", "collection", "sentinel", "sentinel_tb"))
    assert all(timing[v]["gc_us_per_step"] >= 0 and timing[v]["gc_full"] >= 0 for v in timing if isinstance(timing[v], dict))
    calls = results["calls"]["stack10"]
    assert calls["sentinel"] > calls["bare"] > 0
    launches = results["launches"]
    for path in ("cpu", "accelerator"):
        every, without = launches[f"stack100/{path}/all"], launches[f"stack100/{path}/no_loss_spike"]
        assert every["modules"] == 101 and every["per_module"] > 0
        assert every["per_step"] >= without["per_step"]  # the spike ring only adds
    md = (tmp_path / "fixed-cost-cpu.md").read_text()
    assert "empty hooks (floor)" in md and "### Targets (issue 22 item 7)" in md
    assert "Python garbage collection in the timed steps" in md
    assert "CPU (attach default, check='auto')" in md and "accelerator (check='deferred'" in md
