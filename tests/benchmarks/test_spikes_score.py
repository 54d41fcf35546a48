"""The loss-spike benchmark's scoring (``benchmarks/spikes/run.py``), on hand-made rows: a run
the sentinel stopped with ``NonFiniteError`` counts as found where the error points, with a
wrong cause; a ``loss_spike`` finding is judged on its module, lead and cause."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.spikes.injections import Injection  # noqa: E402
from benchmarks.spikes.run import score, table  # noqa: E402
from benchmarks.spikes.train import Run  # noqa: E402


def _row(finding: dict[str, Any], stopped_at: Optional[int]) -> dict[str, Any]:
    inj = Injection("corrupted_weight", 150, "blocks.3.ln1", {"elements": 4, "exponent": 18})
    loss = np.full(190, 1.3)
    if stopped_at is not None:
        loss[stopped_at + 1:] = np.nan
    return {"run": Run(100, 190, "base.pt", inj), "loss": loss, "findings": [finding], "counts": [],
            "stopped_at": stopped_at}


def test_a_run_stopped_by_a_non_finite_error_is_found_there_with_a_wrong_cause() -> None:
    error = {"kind": "non_finite", "step": 150, "module": "blocks.3.attn",
             "evidence": {"likely_cause": "local_gradients", "likely_causes": []}}
    result = score([_row(error, stopped_at=150)])
    c = result["per_cause"]["corrupted_weight"]
    assert (c["n"], c["sentinel"], c["cause"], c["mover"], c["mover_n"]) == (1, 1, 0, 0, 1)
    assert result["stopped"] == ["corrupted_weight-100"]
    assert "corrupted_weight-100" in table(result)


def test_an_error_that_names_the_rewritten_weight_has_the_corruption_as_its_cause() -> None:
    moved = {"cause": "weights_changed", "evidence": {"weights": [{"parameter": "blocks.3.ln1.weight"}]}}
    error = {"kind": "non_finite", "step": 150, "module": "blocks.3.attn",
             "evidence": {"likely_cause": "weights_changed", "likely_causes": [moved]}}
    c = score([_row(error, stopped_at=150)])["per_cause"]["corrupted_weight"]
    assert (c["sentinel"], c["cause"], c["mover"]) == (1, 1, 1)


def test_a_spike_finding_is_judged_on_module_lead_and_cause() -> None:
    spike = {"kind": "loss_spike", "step": 151, "module": "blocks.3.attn",
             "evidence": {"cause": "corrupted_weight", "lead_steps": 1}}
    result = score([_row(spike, stopped_at=None)])
    c = result["per_cause"]["corrupted_weight"]
    assert (c["sentinel"], c["cause"], c["mover"]) == (1, 1, 0)  # another module than the injected one
    assert result["stopped"] == []
