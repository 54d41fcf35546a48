"""``python -m benchmarks.gpu_check`` runs its CPU half end to end (tiny models, few steps).

Nothing here asserts on a timing. The CPU half must count launching ops per module per step,
audit host reads (0 added in deferred mode), and find an injected NaN at its exact step and
module in deferred mode; the CUDA-only sections are checked for their shape on fabricated
results, since no GPU runs in CI.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import gpu_check  # noqa: E402


@pytest.fixture(scope="module")
def cpu_half(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("gpu_check")
    assert gpu_check.main(["--device", "cpu", "--tiny", "--steps", "10", "--out", str(out)]) == 0
    results = json.loads((out / "gpu_check-cpu.json").read_text())
    return results, (out / "gpu_check-cpu.md").read_text()


def test_cpu_half_counts_launches_per_module_for_both_models(cpu_half: tuple[dict, str]) -> None:
    results, _ = cpu_half
    assert set(results["checks"]) == {"eager"}  # no compiled half without CUDA
    for model in ("gpt2s", "cnn"):
        r = results["checks"]["eager"][model]
        assert "failed" not in r, r.get("failed")
        d = r["dispatch_launches"]
        assert d["modules"] > 10
        assert d["variants"]["bare"]["added_per_step"] == 0
        assert d["variants"]["sentinel_deferred"]["added_per_module_per_step"] > 0
        assert "profiler_launches" not in r and "overhead" not in r  # CUDA only


def test_cpu_half_audits_host_reads_and_finds_the_nan_step(cpu_half: tuple[dict, str]) -> None:
    results, _ = cpu_half
    for model, r in results["checks"]["eager"].items():
        assert r["sync_audit"]["sentinel_deferred"]["added_host_reads_per_step"] == 0, model
        nan = r["nan_step"]
        assert nan["exact"], nan
        assert nan["found"]["step"] == gpu_check.Config().nan_step
        assert nan["found"]["module"] == gpu_check.NAN_MODULE[model]


def test_cpu_half_writes_the_markdown_table_and_targets(cpu_half: tuple[dict, str]) -> None:
    results, markdown = cpu_half
    assert markdown.startswith("## GPU check on CPU")
    assert "CPU half" in markdown and "### Targets" in markdown
    rows = [line for line in markdown.splitlines() if line.startswith("| eager |")]
    assert {row.split("|")[2].strip() for row in rows} == {"gpt2s", "cnn"}
    met = {t["target"]: t["met"] for t in results["targets"]}
    assert met["eager cnn: deferred NaN reported at its exact step and module"] is True
    assert met["eager gpt2s: sentinel_deferred added host reads == 0"] is True


def test_cuda_targets_need_zero_syncs_and_tighter_compiled_ratios() -> None:
    def model(ratio: float, sync: str) -> dict:
        return {
            "sync_audit": {"bare": {"cuda_sync_error_mode": "ok"}, "sentinel_deferred": {"cuda_sync_error_mode": sync}},
            "overhead": {"bare": {"ratio_median": 1.0}, "sentinel": {"ratio_median": ratio}},
            "nan_step": {"exact": True, "found": {"step": 4}},
        }

    results = {
        "meta": {"device": "cuda"},
        "checks": {"eager": {"gpt2s": model(1.02, "ok")}, "compiled": {"gpt2s": model(1.02, "RuntimeError: sync")}},
    }
    met = {t["target"]: t["met"] for t in gpu_check.targets(results)}
    assert met["eager gpt2s: sentinel / bare <= 1.03"] is True
    assert met["compiled gpt2s: sentinel / bare <= 1.01"] is False
    assert met["eager gpt2s: sentinel_deferred under set_sync_debug_mode('error')"] is True
    assert met["compiled gpt2s: sentinel_deferred under set_sync_debug_mode('error')"] is False


@pytest.mark.parametrize(
    ("key", "launch"),
    [("cudaLaunchKernel", True), ("cuLaunchKernelEx", True), ("cudaMemcpyAsync", False), ("aten::mm", False)],
    ids=["runtime", "driver", "memcpy", "aten-op"],
)
def test_profiler_launch_events_are_the_runtime_and_driver_launch_calls(key: str, launch: bool) -> None:
    assert gpu_check.is_launch(key) is launch


def test_unknown_models_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        gpu_check.parse(["--models", "cnn,nonsense"])
    assert "nonsense" in capsys.readouterr().err


def test_compiled_half_runs_on_cpu_and_finds_the_nan_step(tmp_path: Path) -> None:
    """The compiled half's logic (compiled copies, the NaN written into a weight, the sync audit's
    shape) run on CPU with the aot_eager backend: on CUDA only the backend and the timing differ."""
    import torch._dynamo

    guards = torch._dynamo.config.skip_nnmodule_hook_guards
    assert gpu_check.main(["--device", "cpu", "--tiny", "--steps", "3", "--models", "cnn",
                           "--compiled-on-cpu", "--backend", "aot_eager", "--out", str(tmp_path)]) == 0
    # its dynamo options were the run's own: the rest of the process keeps its settings
    assert torch._dynamo.config.skip_nnmodule_hook_guards == guards
    results = json.loads((tmp_path / "gpu_check-cpu.json").read_text())
    r = results["checks"]["compiled"]["cnn"]
    assert "failed" not in r, r.get("failed")
    assert set(r["sync_audit"]) == set(gpu_check.VARIANTS)
    assert r["nan_step"]["exact"], r["nan_step"]
    assert r["nan_step"]["found"]["module"] == gpu_check.NAN_MODULE["cnn"]
