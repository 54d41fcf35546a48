"""The overhead benchmark runs end to end with one command and writes well-formed results.

Timings on a shared CI machine mean nothing, so nothing here asserts on a figure; the tests
check that every section ran, that the sentinel variants really ran (not skipped), and that
the sync audit and the table come out as the README expects them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import models as bench_models  # noqa: E402
from benchmarks import overhead  # noqa: E402
from benchmarks.variants import DEFAULT_VARIANTS, Variant  # noqa: E402

SENTINEL_VARIANTS = ("sentinel", "sentinel_deferred", "sentinel_tb")


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("bench")
    argv = [
        sys.executable,
        "-m",
        "benchmarks.overhead",
        "--tiny",
        "--models",
        "mlp",
        "--rounds",
        "2",
        "--round-seconds",
        "0.001",
        "--warmup",
        "2",
        "--audit-steps",
        "2",
        "--memory-steps",
        "1",
        "--memory-variants",
        "bare,sentinel,sentinel_deferred,sentinel_tb",
        "--scaling",
        "4",
        "--scaling-rounds",
        "1",
        "--paired-seconds",
        "0.01",
        "--threads",
        "1",
        "--out",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "overhead-cpu.json").read_text())
    markdown = (out / "overhead-cpu.md").read_text()
    assert markdown in proc.stdout
    return results, markdown


def test_cli_times_every_available_variant_against_bare(cli_results: tuple[dict, str]) -> None:
    results, _ = cli_results
    mlp = results["timing"]["eager"]["mlp"]
    ran, skipped = set(mlp["variants"]), set(mlp["skipped"])
    assert ran | skipped == set(DEFAULT_VARIANTS)
    assert not ran & skipped
    for name in (
        "bare",
        *SENTINEL_VARIANTS,
        "detect_anomaly",
        "naive_hooks",
        "grad_norm_item",
        "clip_grad_norm",
    ):
        assert name in ran, mlp["skipped"].get(name)
    for name, reason in mlp["skipped"].items():
        assert reason, f"{name} skipped without a reason"
    for entry in mlp["variants"].values():
        assert entry["rounds"] == 2
        assert entry["ratio_min"] <= entry["ratio_median"] <= entry["ratio_max"]
        assert entry["median_ms"] > 0
    assert mlp["variants"]["bare"]["ratio_median"] == 1.0
    assert set(mlp["sentinel_config"]) == set(SENTINEL_VARIANTS)
    assert mlp["sentinel_config"]["sentinel"]["check_mode"] == "immediate"
    assert mlp["sentinel_config"]["sentinel_deferred"]["check_mode"] == "deferred"


def test_cli_audits_host_reads_of_the_sentinel_variants(cli_results: tuple[dict, str]) -> None:
    results, _ = cli_results
    audit = results["timing"]["eager"]["mlp"]["sync_audit"]
    assert set(audit) == {"bare", *SENTINEL_VARIANTS}
    for entry in audit.values():
        assert entry["host_reads_per_step"] >= 0
        assert "added_host_reads_per_step" in entry
    targets = {t["target"]: t for t in results["targets"]}
    deferred = targets["eager mlp: sentinel_deferred added host reads per step == 0"]
    assert deferred["value"] == audit["sentinel_deferred"]["added_host_reads_per_step"]
    assert deferred["met"] is True


def test_cli_measures_memory_and_scaling(cli_results: tuple[dict, str]) -> None:
    results, _ = cli_results
    memory = results["memory"]["mlp"]
    assert memory["bare"]["delta_mb"] == 0
    for name in ("bare", *SENTINEL_VARIANTS):
        assert memory[name]["peak_mb"] > 0
    scaling = results["scaling"]["4"]
    assert set(scaling) == set(overhead.SCALING_VARIANTS)
    assert scaling["bare"]["added_us_per_module"] == 0


def test_cli_writes_the_readme_table(cli_results: tuple[dict, str]) -> None:
    results, markdown = cli_results
    meta = results["meta"]
    assert meta["torch"] in markdown and meta["cpu"] in markdown
    assert "| bare, ms/step |" in markdown
    assert "| torch_sentinel default (auto) | " in markdown
    assert "### Memory" in markdown and "### Scaling" in markdown and "### Targets" in markdown
    header = next(line for line in markdown.splitlines() if line.startswith("| variant | mlp"))
    assert header.count("|") == 3


@pytest.mark.parametrize(
    ("bare", "other", "median", "lo", "hi", "mean"),
    [
        ([1.0, 2.0, 1.0], [1.1, 2.2, 1.3], 1.1, 1.1, 1.3, 4.6 / 4.0),
        ([2.0, 2.0], [1.0, 3.0], 1.0, 0.5, 1.5, 1.0),
    ],
    ids=["drift-cancels-per-round", "even-rounds"],
)
def test_summarize_takes_ratios_within_each_round(
    bare: list[float], other: list[float], median: float, lo: float, hi: float, mean: float
) -> None:
    s = overhead.summarize({"bare": bare, "other": other})["other"]
    assert s["ratio_median"] == pytest.approx(median)
    assert (s["ratio_min"], s["ratio_max"]) == (pytest.approx(lo), pytest.approx(hi))
    assert s["ratio_mean"] == pytest.approx(mean)


def test_summarize_compares_alternatives_with_the_sentinel_round_by_round() -> None:
    s = overhead.summarize(
        {"bare": [1.0, 1.0], "sentinel": [1.0, 2.0], "detect_anomaly": [2.0, 2.0]}
    )
    assert s["detect_anomaly"]["vs_sentinel_median"] == pytest.approx(1.5)
    assert "vs_sentinel_median" not in s["sentinel"]


@pytest.mark.parametrize("flag", ["--variants", "--models"], ids=["variant", "model"])
def test_unknown_names_are_refused_before_anything_runs(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        overhead.parse([flag, "bare,nonsense"])
    assert "nonsense" in capsys.readouterr().err


def _timing(ratio: float, audit: dict) -> dict:
    return {
        "variants": {"bare": {"ratio_median": 1.0}, "sentinel": {"ratio_median": ratio}},
        "sync_audit": audit,
    }


def test_gpu_targets_are_tighter_under_compile_and_need_zero_syncs() -> None:
    ok = {"cuda_sync_error_mode": "ok", "added_host_reads_per_step": 0.0}
    synced = {"cuda_sync_error_mode": "RuntimeError: called a synchronizing CUDA operation"}
    results = {
        "meta": {"device": "cuda"},
        "timing": {
            "eager": {"gpt": _timing(1.02, {"bare": ok, "sentinel": ok, "sentinel_deferred": ok})},
            "compiled": {"gpt": _timing(1.02, {"bare": ok, "sentinel_deferred": synced})},
        },
    }
    met = {t["target"]: t["met"] for t in overhead.check_targets(results)}
    assert met == {
        "eager gpt: sentinel default / bare <= 1.03": True,
        "eager gpt: sentinel added host reads per step == 0": True,
        "eager gpt: sentinel under set_sync_debug_mode('error')": True,
        "eager gpt: sentinel_deferred added host reads per step == 0": True,
        "eager gpt: sentinel_deferred under set_sync_debug_mode('error')": True,
        "compiled gpt: sentinel default / bare <= 1.01": False,
        "compiled gpt: sentinel_deferred under set_sync_debug_mode('error')": False,
    }


class _BreaksAtStep(Variant):
    name = "breaks"

    def after_backward(self, step: int) -> None:
        if step == 3:
            raise ValueError("boom at step 3")


def test_a_variant_that_raises_mid_run_is_dropped_and_the_others_keep_their_rounds(
    tmp_path: Path,
) -> None:
    cpu = torch.device("cpu")
    contestants = {
        name: overhead.Contestant(bench_models.build("mlp", cpu, tiny=True), variant, str(tmp_path))
        for name, variant in (("bare", Variant()), ("breaks", _BreaksAtStep()))
    }
    failed: dict[str, str] = {}
    per_step = overhead._time_rounds(contestants, cpu, rounds=3, steps=2, failed=failed)
    assert set(per_step) == {"bare"} and len(per_step["bare"]) == 3
    assert "boom at step 3" in failed["breaks"] and "round 1" in failed["breaks"]


def test_cli_measures_the_paired_steady_state(cli_results: tuple[dict, str]) -> None:
    results, markdown = cli_results
    paired = results["paired"]["mlp"]
    assert paired["steps"] == overhead.PAIRED_MIN_STEPS  # 0.01 s buys the minimum
    assert paired["first_step"] >= overhead.SCALING_WARMUP  # past the first 100 steps' sampling
    assert paired["ratio_q1"] <= paired["ratio_median"] <= paired["ratio_q3"]
    assert paired["bare_ms"] > 0 and paired["sentinel_ms"] > 0
    assert "### Steady state, paired" in markdown
    assert any(t["target"].startswith("paired steady state mlp") for t in results["targets"])
