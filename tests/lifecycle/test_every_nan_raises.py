"""Every NaN step raises under on_nonfinite="raise": a loop that catches NonFiniteError and
skips the batch stays protected; what is logged (finding, console, incident) is deduplicated."""

from __future__ import annotations

import contextlib

import pytest
import torch
from helpers import MLP, make_batch
from torch import nn

import torch_sentinel

BAD = (3, 4, 8)


def _batches(n: int = 12) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        x, y = make_batch("mlp", generator=g)
        if i in BAD:
            x[1, 2] = float("nan")  # a corrupt sample
        out.append((x, y))
    return out


def _skip_loop(model: nn.Module, opt: torch.optim.Optimizer, skip_known_bad: bool) -> tuple[list[int], list[float]]:
    raised, losses = [], []
    for i, (x, y) in enumerate(_batches()):
        if skip_known_bad and i in BAD:
            continue
        try:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        except torch_sentinel.NonFiniteError:
            raised.append(i)
    return raised, losses


def test_catch_and_skip_loop_is_protected_at_every_bad_batch(tmp_path) -> None:
    """Immediate mode raises in the forward hook of each bad batch, before its update: skipping
    them trains exactly like a loop that never saw them."""
    torch.manual_seed(0)
    reference = MLP()
    model = MLP()
    model.load_state_dict(reference.state_dict())
    _, expected = _skip_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.1), skip_known_bad=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_sentinel.attach(model, opt, check="immediate", log_dir=str(tmp_path)) as s:
        raised, losses = _skip_loop(model, opt, skip_known_bad=False)
    assert raised == list(BAD)
    assert losses == expected  # bit-identical: the skipped batches left no trace
    assert s.nonfinite_raised == len(BAD)
    assert s.step == 12 - len(BAD)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    # Logged once: one finding, one line in findings.jsonl.
    assert [f.kind for f in s.findings].count("non_finite") == 1
    lines = (tmp_path / "findings.jsonl").read_text().splitlines()
    assert sum('"non_finite"' in line for line in lines) == 1


def test_deferred_mode_raises_at_every_faulty_step_after_the_first() -> None:
    """Deferred mode finds the fault once the step's row landed (its update already ran, so
    the weights are NaN from there on): every later step raises too, never silence."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_sentinel.attach(model, opt, check="deferred") as s:
        raised, _ = _skip_loop(model, opt, skip_known_bad=False)
    assert raised == list(range(BAD[0], 12))
    assert [f.kind for f in s.findings].count("non_finite") == 1


@pytest.mark.parametrize("policy", ["warn", "record"], ids=["warn", "record"])
def test_warn_and_record_report_the_first_fault_only(policy: str) -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    expect = pytest.warns(RuntimeWarning) if policy == "warn" else contextlib.nullcontext()
    with expect, torch_sentinel.attach(model, opt, check="immediate", on_nonfinite=policy) as s:
        raised, _ = _skip_loop(model, opt, skip_known_bad=False)
    assert raised == [] and s.nonfinite_raised == 0
    assert [f.kind for f in s.findings].count("non_finite") == 1

