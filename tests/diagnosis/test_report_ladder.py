"""The diagnosis: the first failing rung in ladder order, the next check in the seeds'
vocabulary, and a report that reads like an experiment log."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torch_sentinel
from torch_sentinel import Finding, Report
from torch_sentinel.diagnosis.ladder import HEALTHY_NEXT_CHECK, explains

SEED_CASES = {
    # the seeds' Lab: name -> (findings' (kind, boundary), expected boundary, expected next check)
    "shape": ([("loss_broadcast", "shapes"), ("plateau", "curves")], "shapes", "reshape_target_or_output_to_match"),
    "dead_relu": ([("dead_relu", "forward"), ("no_gradient", "gradients")], "forward",
                  "inspect_initialization_and_learning_rate"),
    "no_update": ([("no_update", "updates")], "updates", "inspect_optimizer_update"),
    "overfit": ([("overfitting", "curves")], "curves", "investigate_generalization"),
    "healthy": ([], None, HEALTHY_NEXT_CHECK),
}


@pytest.mark.parametrize("case", list(SEED_CASES), ids=list(SEED_CASES))
def test_first_failing_rung_decides(case: str) -> None:
    kinds, boundary, check = SEED_CASES[case]
    findings = [Finding(kind=k, boundary=b, message=k, step=i) for i, (k, b) in enumerate(reversed(kinds))]
    report = Report(findings=findings, steps=10)
    assert report.boundary == boundary
    assert report.next_check == check
    assert report.ok is (boundary is None)


def test_info_findings_do_not_fail_a_rung() -> None:
    report = Report(findings=[Finding(kind="note", boundary="data", message="fyi", severity="info")])
    assert report.ok and report.boundary is None and report.next_check == HEALTHY_NEXT_CHECK


def test_every_shipped_kind_declares_its_next_check_and_hypothesis() -> None:
    from torch_sentinel.detectors import builtin_detectors

    for cls in builtin_detectors():
        assert cls.next_check and cls.hypothesis, cls.__name__


def test_report_text_reads_like_an_experiment_log() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # parameters never change
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(8):
            x = torch.randn(8, 4)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), x[:, :1]).backward()
            opt.step()
        report = s.report()
    text = str(report)
    assert report.boundary == "updates" and report.next_check == "inspect_optimizer_update"
    assert "  updates    FAIL  <- first failing boundary" in text
    block = text[text.index("[error] no_update"):]
    lines = block.splitlines()
    assert lines[1].startswith("  symptom:    ") and "bit-identical" in lines[1]
    assert lines[2].startswith("  evidence:   ") and "lrs=[0]" in lines[2]
    assert lines[3].startswith("  hypothesis: ")
    assert lines[4] == "  next check: inspect_optimizer_update"
    assert text.rstrip().endswith("next check: inspect_optimizer_update")
    assert report.to_dict()["boundary"] == "updates"


def _f(kind: str, boundary: str, step: int = 5, severity: str = "warning") -> Finding:
    return Finding(kind=kind, boundary=boundary, message=kind, step=step, severity=severity)  # type: ignore[arg-type]


@pytest.mark.parametrize(("cause", "symptom"), [
    (("no_update", "updates", 30), ("plateau", "curves", 29)),
    (("update_ratio", "updates", 8), ("exploding_gradient", "gradients", 5)),
    (("missing_zero_grad", "gradients", 9), ("exploding_gradient", "gradients", 3)),
    (("no_gradient", "gradients", 9), ("vanishing_gradient", "gradients", 4)),
], ids=["no_update_explains_plateau", "lr_too_high_explains_explosion", "accumulation_explains_explosion",
        "cut_graph_explains_vanishing"])
def test_the_cause_leads_its_symptoms(cause: tuple[str, str, int], symptom: tuple[str, str, int]) -> None:
    """Issue 25: when one fault triggers several kinds, the report leads with the cause-side kind,
    whatever rung or step the symptom was seen on."""
    report = Report([_f(*symptom), _f(*cause)])
    assert [f.kind for f in report.findings] == [cause[0], symptom[0]]
    assert report.boundary == cause[1]
    assert explains(cause[0], symptom[0]) and not explains(symptom[0], cause[0])


def test_an_info_finding_never_leads_and_unrelated_kinds_keep_ladder_order() -> None:
    report = Report([_f("plateau", "curves"), _f("no_update", "updates", severity="info"),
                     _f("dead_relu", "forward", 20)])
    assert [f.kind for f in report.findings][:2] == ["dead_relu", "no_update"]
    assert report.boundary == "forward"
