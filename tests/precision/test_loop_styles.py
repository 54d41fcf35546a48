"""The precision probe's sampled steps on the loop shapes users write: a GAN (two sentinels, two
optimizers), ``step(closure)``, gradient accumulation and no optimizer.

On each: training is bit-identical to the bare loop, no probe is switched off, rows are taken
at the histogram steps only (0, 1, 2, 10), and the amax-only steps 3-9 reach the overflow trend
(inputs grow 1.5x a step: the first layer's row at step 10 fits the eight samples 3..10, a span
of 7 steps; without them it would fit 0, 1, 2 and 10, a span of 10).
"""

from __future__ import annotations

import copy
import logging
from typing import Callable, Optional

import pytest
import torch
from precision.reference import RowSink
from torch import nn

import torch_sentinel

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS = 12
FORMATS = ("fp16", "bf16")
#: Steps 0-11 as the probe samples them: histograms at 0, 1, 2 and 10, amax alone at 3-9.
HISTOGRAM_STEPS = {0, 1, 2, 10}


def _net(seed: int, n_in: int = 8, n_out: int = 4) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(n_in, 16), nn.Tanh(), nn.Linear(16, n_out))


def _batch(step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs that grow 1.5x a step, so that the first layer's activations have an amax trend."""
    g = torch.Generator().manual_seed(1000 * step + micro)
    return torch.randn(6, 8, generator=g) * 1.5**step, torch.randn(6, 4, generator=g) * 1.5**step


Loop = Callable[[list[nn.Module], bool], list[RowSink]]


def _attach(models: list[nn.Module], optimizers: list[Optional[torch.optim.Optimizer]],
            watch: bool) -> list[tuple[torch_sentinel.Sentinel, RowSink]]:
    if not watch:
        return []
    attached = []
    for model, opt in zip(models, optimizers):
        sentinel = (torch_sentinel.attach(model, opt, precision=FORMATS) if opt is not None
                    else torch_sentinel.attach(model, precision=FORMATS))
        sink = RowSink()
        sentinel.add_sink(sink)
        attached.append((sentinel, sink))
    return attached


def _finish(attached: list[tuple[torch_sentinel.Sentinel, RowSink]]) -> list[RowSink]:
    for sentinel, _ in attached:
        sentinel.detach()
    return [sink for _, sink in attached]


def gan(models: list[nn.Module], watch: bool) -> list[RowSink]:
    g, d = models
    opt_g = torch.optim.Adam(g.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(d.parameters(), lr=1e-3)
    attached = _attach([g, d], [opt_g, opt_d], watch)
    for step in range(STEPS):
        noise, real = _batch(step)
        opt_d.zero_grad()
        fake = g(noise)
        loss_d = d(real).mean() - d(fake.detach()).mean()
        loss_d.backward()
        opt_d.step()
        opt_g.zero_grad()
        (-d(fake).mean()).backward()
        opt_g.step()
    return _finish(attached)


def closure(models: list[nn.Module], watch: bool) -> list[RowSink]:
    (model,) = models
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
    attached = _attach([model], [opt], watch)
    for step in range(STEPS):
        x, y = _batch(step)

        def evaluate(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss

        opt.step(evaluate)
    return _finish(attached)


def accumulation(models: list[nn.Module], watch: bool) -> list[RowSink]:
    (model,) = models
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    attached = _attach([model], [opt], watch)
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(3):
            x, y = _batch(step, micro)
            (nn.functional.mse_loss(model(x), y) / 3).backward()
        opt.step()
    return _finish(attached)


def no_optimizer(models: list[nn.Module], watch: bool) -> list[RowSink]:
    (model,) = models
    attached = _attach([model], [None], watch)
    for step in range(STEPS):
        x, y = _batch(step)
        model.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.05 * p.grad
    return _finish(attached)


LOOPS: dict[str, tuple[Loop, Callable[[], list[nn.Module]]]] = {
    "gan": (gan, lambda: [_net(0, 8, 4), _net(1, 4, 1)]),
    "closure": (closure, lambda: [_net(0)]),
    "accumulation": (accumulation, lambda: [_net(0)]),
    "no-optimizer": (no_optimizer, lambda: [_net(0)]),
}


@pytest.mark.parametrize("name", list(LOOPS), ids=list(LOOPS))
def test_sampled_steps_on_every_loop_shape(name: str, caplog: pytest.LogCaptureFixture) -> None:
    loop, build = LOOPS[name]
    bare = build()
    watched = [copy.deepcopy(m) for m in bare]
    loop(bare, False)
    with caplog.at_level(logging.WARNING, logger="torch_sentinel"):
        sinks = loop(watched, True)
    assert not [r.getMessage() for r in caplog.records if "switched off" in r.getMessage()]
    for plain, seen in zip(bare, watched):
        for (pname, a), (_, b) in zip(plain.named_parameters(), seen.named_parameters()):
            assert torch.equal(a, b), f"{name}: {pname} differs from the bare loop's"
    for sink in sinks:
        assert {r.step for r in sink.rows} == HISTOGRAM_STEPS, name
        assert {r.tensor for r in sink.rows} == {"activation", "gradient"}, name
        assert set(sink.formats) == set(FORMATS)
        first_layer = [r for r in sink.rows if r.step == 10 and r.module == "0" and r.tensor == "activation"]
        assert len(first_layer) == len(FORMATS), name
        assert all(r.trend_span == 7 for r in first_layer), [(r.format, r.trend_span) for r in first_layer]
