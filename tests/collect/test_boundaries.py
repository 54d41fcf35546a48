"""The collector's boundaries for everything recorded to reduce later, and its one RNG copy.

The pending module outputs (``BatchedMax``) and saturation fractions (``BatchedFractions``) are
the collector's: one flush at each boundary for both, one drop for both when the step is
abandoned or the model's forward raises. And one copy of the torch RNG state per root call,
shared by the collector's rerun, the shape notes and the incident recorder.
"""

from __future__ import annotations

import gc
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import torch_sentinel
from torch_sentinel._collect.probe import Probe, ProbeHost
from torch_sentinel._collect.saturation import SaturatedFractions
from torch_sentinel._record import StepRecord
from torch_sentinel.facts import Activations


class FailOnFlag(nn.Module):
    """Passes its input on, or raises ValueError while ``fail`` is set (a bad batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fail:
            raise ValueError("a bad batch")
        return x


class Host(Probe):
    """Hands the test the collector, as any probe gets it."""

    def setup(self, host: ProbeHost) -> None:
        self.host: Any = host


def _host(sentinel: torch_sentinel.Sentinel) -> Any:
    probe = Host()
    sentinel.add_probe(probe)
    return probe.host


class Net(nn.Module):
    """Linear, Tanh (skipped on request), a module that raises on a flag, Linear, Sigmoid."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1 = nn.Linear(8, 8)
        self.tanh = nn.Tanh()
        self.gate = FailOnFlag()
        self.lin2 = nn.Linear(8, 8)
        self.sig = nn.Sigmoid()

    def forward(self, x: torch.Tensor, skip_tanh: bool = False) -> torch.Tensor:
        h = self.lin1(x)
        if not skip_tanh:
            h = self.tanh(h)
        return self.sig(self.lin2(self.gate(h)))


def _model() -> Net:
    torch.manual_seed(0)
    return Net()


def _watch_memory(model: Net, seen: list[weakref.ref[np.ndarray]]) -> list[Any]:
    """Give each output of ``lin1`` and ``tanh`` memory whose life can be watched (a weakref
    to the tensor would die with that object while a detached alias keeps its memory): a numpy
    array's, shared by the tensor and every alias of it. Returns the hook handles."""

    def watched(m: nn.Module, args: object, out: torch.Tensor) -> torch.Tensor:
        memory = out.detach().numpy().copy()
        seen.append(weakref.ref(memory))
        return torch.from_numpy(memory).requires_grad_()

    return [m.register_forward_hook(watched) for m in (model.lin1, model.tanh)]


def _attached() -> tuple[Net, torch.optim.Optimizer, torch_sentinel.Sentinel, Any]:
    """The test model and its optimizer, the sentinel attached in deferred mode, and its collector."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sentinel = torch_sentinel.attach(model, opt, check="deferred")
    return model, opt, sentinel, _host(sentinel)


@pytest.mark.parametrize("check", ["deferred", "immediate"])
def test_a_forward_that_raises_leaves_no_evidence_and_no_activation(check: str) -> None:
    """Rule: a root forward that raises drops what it recorded for later (module maxima and
    saturation fractions alike). The loop catches the error and runs the next batch in the same
    step: the row holds that batch's evidence only, and none of the failed forward's
    activations is alive once the error is handled."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    records: list[StepRecord] = []
    seen: list[weakref.ref[np.ndarray]] = []
    handles = _watch_memory(model, seen)  # before attach: the sentinel sees the watched tensors
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sentinel = torch_sentinel.attach(model, opt, check=check)
    try:
        model.gate.fail = True
        loud = torch.full((4, 8), 50.0)  # every Tanh unit saturated, a large Linear output
        with pytest.raises(ValueError, match="a bad batch"):
            model(loud)
        for h in handles:
            h.remove()
        gc.collect()
        assert len(seen) == 2
        assert [r for r in seen if r() is not None] == [], "the failed forward's activations are still held"

        # The next batch of the same step skips the Tanh: its slot must stay untouched.
        model.gate.fail = False
        quiet = torch.full((4, 8), 0.01)
        with torch.no_grad():  # not a training call: nothing recorded
            expected_lin = model.lin1(quiet).abs().max().item()
        opt.zero_grad()
        model(quiet, skip_tanh=True).sum().backward()
        opt.step()  # step 0 closes: sampled, so saturation was recorded
        sentinel.flush()
        records = [r for r in sentinel.recent_records() if r.step == 0]
    finally:
        sentinel.detach(quiet=True)
    assert len(records) == 1
    rec = records[0]
    saturated = rec.fact(SaturatedFractions)
    assert saturated is not None
    fractions = dict(zip(saturated.modules, saturated.values.tolist()))
    assert fractions["tanh"] == 0.0  # the failed forward's 1.0 is not charged here
    assert fractions["sig"] == 0.0
    act = rec.fact(Activations)
    assert act is not None
    lin1, tanh = list(act.modules).index("lin1"), list(act.modules).index("tanh")
    assert act.hi[lin1] == pytest.approx(expected_lin, rel=1e-6)
    assert act.hi[tanh] < act.lo[tanh]  # untouched pair


def test_a_retry_inside_the_except_block_keeps_its_evidence() -> None:
    """The collector tells a forward that raised from one called while the loop handles an
    earlier error (a retry in the ``except`` block): the retry's outputs are reduced, not
    dropped, with a user hook on the root after attach (so its output hook runs last) too."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # the same weights at every step
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sentinel = torch_sentinel.attach(model, opt, check="deferred")
    model.register_forward_hook(lambda m, a, o: None)  # after attach: torch runs it after ours
    try:
        quiet = torch.full((4, 8), 0.01)
        with torch.no_grad():
            expected_lin = model.lin1(quiet).abs().max().item()
        for _ in range(3):
            model.gate.fail = True
            try:
                model(torch.full((4, 8), 50.0))
            except ValueError:
                model.gate.fail = False
                opt.zero_grad()
                model(quiet).sum().backward()  # the retry, while the ValueError is handled
                opt.step()
        sentinel.flush()
        records = {r.step: r for r in sentinel.recent_records()}
    finally:
        sentinel.detach(quiet=True)
    for step in range(3):
        assert records[step].value("act.max", "lin1") == pytest.approx(expected_lin, rel=1e-6)
        assert records[step].value("saturation", "tanh") == 0.0


def test_one_flush_for_both_batches_and_one_drop() -> None:
    """The collector's boundary reduces the pending maxima and fractions together; abandoning
    the row forgets both."""
    model, _, sentinel, c = _attached()
    try:
        stop: list[tuple[int, int]] = []
        # Inside the forward (the last module's hook): both batches hold this forward's outputs.
        handle = model.sig.register_forward_hook(lambda m, a, o: stop.append((len(c.boundaries.batch), len(c.boundaries.fractions))))
        model(torch.randn(4, 8)).sum().backward()
        handle.remove()
        assert stop[0][0] > 0 and stop[0][1] > 0
        assert (len(c.boundaries.batch), len(c.boundaries.fractions)) == (0, 0)  # the end of the forward flushed both

        c.reduce_later(torch.ones(3), c.ledger.block("act.min").start, c.ledger.block("act.max").start, "test")
        c.fraction_later(torch.ones(3), c.ledger.block("saturation").start, 0.0, 0.5)
        c.abandon_row()
        assert (len(c.boundaries.batch), len(c.boundaries.fractions)) == (0, 0)
    finally:
        sentinel.detach(quiet=True)


class Held:
    """A probe's own batch (``ProbeHost.flush_at_boundaries``): counts what the collector does with it."""

    def __init__(self) -> None:
        self.items: list[int] = []
        self.flushed: list[int] = []
        self.dropped = 0

    def __len__(self) -> int:
        return len(self.items)

    def flush(self) -> None:
        self.flushed.append(len(self.items))
        self.items = []

    def drop(self) -> None:
        self.dropped += 1
        self.items = []


def test_a_probes_own_batch_is_flushed_and_dropped_with_the_collectors() -> None:
    model, opt, sentinel, c = _attached()
    held = Held()
    c.flush_at_boundaries(held)
    try:
        handle = model.lin1.register_forward_hook(lambda m, a, o: held.items.append(1))
        model(torch.randn(4, 8)).sum().backward()
        assert held.flushed[:1] == [1] and len(held) == 0  # the end of the forward flushed it
        opt.step()
        assert sum(held.flushed) == 1  # flushed once per recorded item

        model.gate.fail = True
        with pytest.raises(ValueError, match="a bad batch"):
            model(torch.randn(4, 8))
        assert held.dropped >= 1 and len(held) == 0  # a forward that raised drops it
        handle.remove()

        held.items.append(1)
        dropped = held.dropped
        c.abandon_row()
        assert held.dropped == dropped + 1 and len(held) == 0
    finally:
        sentinel.detach(quiet=True)


@pytest.fixture
def rng_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts ``torch.get_rng_state`` calls (the real function runs: this measures, it fakes nothing)."""
    calls = [0]
    real = torch.get_rng_state

    def counting() -> torch.Tensor:
        calls[0] += 1
        return real()

    monkeypatch.setattr(torch, "get_rng_state", counting)
    yield calls


@pytest.mark.parametrize("check", ["immediate", "deferred"])
def test_one_rng_copy_per_root_forward(rng_reads: list[int], tmp_path: Any, check: str) -> None:
    """With log_dir set, shape notes, the incident recorder and (on ordinary steps, immediate
    mode) the collector's rerun all need the state at the forward's entry: one copy, shared.
    It was up to three. An evaluation forward (shape notes only) copies once too."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.1), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sentinel = torch_sentinel.attach(model, opt, check=check, log_dir=str(tmp_path))
    c = _host(sentinel)
    per_forward: list[tuple[bool, int]] = []
    try:
        g = torch.Generator().manual_seed(1)
        for _ in range(14):  # steps 0-9 are sampled (every module hooked), then ordinary ones
            x = torch.randn(4, 8, generator=g)
            ordinary = not c.fully_watched
            before = rng_reads[0]
            loss = model(x).square().mean()
            per_forward.append((ordinary, rng_reads[0] - before))
            opt.zero_grad()
            loss.backward()
            opt.step()
        before = rng_reads[0]
        with torch.no_grad():
            model(torch.randn(4, 8, generator=g))
        evaluation = rng_reads[0] - before
    finally:
        sentinel.detach(quiet=True)
    assert [n for _, n in per_forward] == [1] * 14
    assert any(o for o, _ in per_forward) == (check == "immediate")
    assert evaluation == 1


def test_the_shared_rng_state_is_the_forwards_own(tmp_path: Any) -> None:
    """The state the collector keeps for a root call is the one the forward starts with (after
    the pre-hooks registered before attach), and a later call gets a new one."""
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))
    # A pre-hook that draws from the generator before the forward starts (input noise).
    model.register_forward_pre_hook(lambda m, args: (args[0] + 0.01 * torch.randn_like(args[0]),))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sentinel = torch_sentinel.attach(model, opt, log_dir=str(tmp_path))
    c = _host(sentinel)
    started: list[torch.Tensor] = []
    model[0].register_forward_pre_hook(lambda m, args: started.append(torch.get_rng_state()))
    try:
        states = []
        for _ in range(2):
            model(torch.randn(4, 8)).sum().backward()
            states.append(c.forward_rng()[0])
            opt.step()
    finally:
        sentinel.detach(quiet=True)
    assert torch.equal(states[0], started[0]) and torch.equal(states[1], started[1])
    assert not torch.equal(states[0], states[1])
