"""The replica_divergence finding and error: what differs, where, and what to check next."""

from __future__ import annotations

import pytest

import torch_sentinel
from torch_sentinel.detectors import RunContext
from torch_sentinel.detectors.replica_divergence import Divergence, ReplicaDivergenceDetector


def _detector(**thresholds: float) -> ReplicaDivergenceDetector:
    ctx = RunContext(module_names=[], module_types={}, param_names=[], param_owner={},
                     optimizer_params=set(), forward_order=list, thresholds=thresholds)
    detector = ReplicaDivergenceDetector()
    detector.bind(ctx)
    return detector


FLIP = Divergence(parameter="fc1.weight", state=None, module="fc1", ranks=(2,), reference=(0, 1, 3),
                  majority=True, mode="exact", first_seen_step=6, last_agreeing_step=3,
                  numel=32768, chunk=(768, 776))


def test_error_says_what_where_and_next() -> None:
    with pytest.raises(torch_sentinel.ReplicaDivergenceError,
                       match=r"(?s)^replicas differ at step 6: rank 2 holds another fc1.weight than ranks 0, 1, 3\n"
                             r"  expected: the same fc1.weight, bit for bit.*\n"
                             r"  arrived:  elements \[768, 776\) of 32768 \(flattened\) hold a difference\n"
                             r"  where:    module fc1, parameter fc1.weight; first seen at the start of step 6; "
                             r"the last check that agreed was at the start of step 3\n"
                             r"  next:     check, in order: the hardware of rank 2.*skipped optimizer.step\(\).*"
                             r"unused parameters.*edits weights on one rank only$") as caught:
        raise _detector().error(FLIP)
    err = caught.value
    assert isinstance(err, torch_sentinel.SentinelError)
    assert (err.step, err.rank, err.ranks, err.module, err.parameter, err.chunk) == (
        6, 2, (2,), "fc1", "fc1.weight", (768, 776))
    assert err.kind == "replica_divergence"


def test_finding_carries_the_evidence_on_the_updates_rung() -> None:
    f = _detector().divergence_finding(FLIP)
    assert (f.kind, f.boundary, f.severity, f.rank, f.module, f.step) == (
        "replica_divergence", "updates", "error", 2, "fc1", 6)
    assert f.next_check == "inspect_the_diverged_rank" and "skipped step" in (f.hypothesis or "")
    ev = f.evidence
    assert (ev["parameter"], ev["ranks"], ev["chunk"], ev["first_seen_step"], ev["last_agreeing_step"],
            ev["mode"]) == ("fc1.weight", [2], [768, 776], 6, 3, "exact")


def test_step_counts_that_differ_point_at_a_skipped_step() -> None:
    skipped = Divergence(**{**FLIP.to_dict(), "ranks": (1,), "reference": (0, 2, 3),
                            "steps": {0: 6, 1: 5, 2: 6, 3: 6}, "differing": 14,
                            "others": ("fc1.bias", "fc1.weight:exp_avg")})
    text = str(_detector().error(skipped))
    assert "rank 1 completed 5 optimizer steps, ranks 0, 2, 3 completed 6: a skipped optimizer.step()" in text
    assert "14 tensors differ in all (fc1.bias, fc1.weight:exp_avg, ...)" in text
    assert Divergence.from_dict(skipped.to_dict()) == skipped  # what all_gather_object carries


def test_tolerance_state_and_no_majority_are_said() -> None:
    d = Divergence(parameter="fc2.weight", state="exp_avg", module="fc2", ranks=(3,), reference=(1,),
                   majority=False, mode="tolerance", first_seen_step=9, last_agreeing_step=None,
                   numel=2048, chunk=(0, 32), deviation=3e-3, rtol=1e-5)
    text = str(_detector().error(d))
    assert "another optimizer state 'exp_avg' of fc2.weight than rank 1" in text
    assert "within 1e-05 of its norm" in text and "moved by 0.003 of its norm" in text
    assert "no majority" in text and "the first check" in text


def test_rtol_threshold_is_declared_and_read() -> None:
    assert _detector().rtol == 1e-5
    assert _detector(**{"replica_divergence.rtol": 1e-3}).rtol == 1e-3
