"""The detectors' per-step host work is numpy over index arrays built once per record layout
(gradient_scale, no_gradient): the figures they judge are the ones the loop's own gradients
give, with missing, frozen and exactly-zero gradients, and the index arrays never travel in a
checkpoint."""

from __future__ import annotations

import math

import torch
from torch import nn

import torch_sentinel
from torch_sentinel.detectors._layers import layer_norms
from torch_sentinel.detectors._layers import layers as _layers


def _deep(n: int = 8) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(n) for m in (nn.Linear(6, 6), nn.Tanh())])


def test_layer_norms_are_the_norms_of_the_loops_own_weight_gradients() -> None:
    model = _deep()
    model[4].weight.requires_grad_(False)  # frozen: no layer figure
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sentinel = torch_sentinel.attach(model, opt, on_nonfinite="record", check="deferred")
    expected: dict[int, dict[str, float]] = {}
    for step in range(6):
        opt.zero_grad()
        model(torch.randn(4, 6)).pow(2).mean().backward()
        if step == 2:
            model[8].weight.grad = None  # missing at the step: no layer figure
        if step == 3:
            model[10].weight.grad.zero_()  # exactly zero: no layer figure
        if step == 4:
            model[12].weight.grad[0, 0] = float("nan")  # a NaN figure, as the loop has it
        expected[step] = {
            str(i): float(torch.linalg.vector_norm(model[i].weight.grad.double()))
            for i in range(0, len(model), 2)
            if model[i].weight.grad is not None and bool(model[i].weight.grad.abs().sum() > 0)
        }
        opt.step()
    sentinel.flush()
    layers = _layers(sentinel.context)
    assert len(layers) == 8
    for rec in sentinel.recent_records():
        got = dict(layer_norms(rec, layers))
        want = expected[rec.step]
        assert sorted(got) == sorted(want), rec.step
        for name, value in want.items():
            if math.isnan(value):
                assert math.isnan(got[name])
            else:
                assert math.isclose(got[name], value, rel_tol=1e-5), (rec.step, name)
    sentinel.detach()


def test_no_gradient_keeps_its_verdict_across_a_checkpoint_and_saves_no_index_arrays() -> None:
    """Exactly-zero gradients every step (the fast path's settled parameters) before and after a
    resume: the resumed run reports what the uninterrupted one does."""

    class Gated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(4, 4)
            self.gate = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x) + 0.0 * self.gate(x)  # gate's .grad exists and is exactly 0

    def run(cut: int | None) -> list[tuple[str, str | None, int | None]]:
        torch.manual_seed(0)
        model = Gated()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sentinel = torch_sentinel.attach(model, opt, flush_every=2)
        for step in range(8):
            if step == cut:
                state = sentinel.state_dict()
                for d in sentinel._detectors:  # as tests/test_options.py reads them
                    assert not [k for k in d.state_dict() if k.endswith("_cache")], type(d).__name__
                sentinel.detach()
                sentinel = torch_sentinel.attach(model, opt, flush_every=2, start_step=step)
                sentinel.load_state_dict(state)
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
        findings = [(f.kind, f.module, f.step) for f in sentinel.report().findings if f.kind == "no_gradient"]
        sentinel.detach()
        return findings

    whole = run(None)
    assert whole == [("no_gradient", "gate", 4)]
    assert run(3) == whole


def test_vanishing_gradient_ends_and_update_ratios_match_their_loop_forms() -> None:
    """The vanishing detector's per-record figures, as numpy over index arrays: the layer at
    each end (deepest and shallowest by graph depth, the largest gradient there, the first in
    forward order on a tie) and each layer's update/weight ratio (a weight missing from the
    fact counts 0), against the per-layer Python loops they replaced."""
    import numpy as np

    from torch_sentinel.detectors._layers import LayerPlan
    from torch_sentinel.detectors.gradient_scale import VanishingGradientDetector

    model = _deep(6)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sentinel = torch_sentinel.attach(model, opt)
    det = next(d for d in sentinel._detectors if isinstance(d, VanishingGradientDetector))
    layers = _layers(sentinel.context)
    det._layers = layers
    names = [layer for layer, _ in layers]
    rng = np.random.default_rng(0)
    for trial in range(40):
        depths = {layer: int(rng.integers(0, 3)) for layer in names if rng.random() > 0.2}
        det._depths = depths
        plan = LayerPlan([p for _, params in layers for p in params], layers, [])
        # Every layer with a gradient (the usual step, a path of its own) in one trial of four.
        idx = np.arange(len(names)) if trial % 4 == 0 else np.flatnonzero(rng.random(len(names)) > 0.3)
        norms = rng.choice([0.5, 1.0, 2.0], size=len(idx))  # ties on purpose
        known = [(names[i], float(v), depths[names[i]]) for i, v in zip(idx, norms) if names[i] in depths]
        if len(known) < 3:
            want = (names[idx[0]], names[idx[-1]]) if len(idx) else None
        else:
            deep, shallow = max(d for *_, d in known), min(d for *_, d in known)
            want = (max(((n, v) for n, v, d in known if d == deep), key=lambda x: x[1])[0],
                    max(((n, v) for n, v, d in known if d == shallow), key=lambda x: x[1])[0])
        if want is not None:
            i, j = det._ends(plan, idx, norms)
            assert (names[idx[i]], names[idx[j]]) == want, trial

        params = [p for _, ps in layers for p in ps]
        present = [p for p in params if rng.random() > 0.1]
        values = rng.random(len(present)) * 2.0
        got = det._layer_norms(f"t{trial}", present, values)
        by_name = dict(zip(present, values.tolist()))
        for k, (_, ps) in enumerate(layers):
            assert math.isclose(got[k], math.sqrt(sum(by_name.get(p, 0.0) ** 2 for p in ps)), rel_tol=1e-12)
    sentinel.detach()
