"""Each format on real small models: the rows equal the cast of the very tensors the model made;
fp16 gradients without a GradScaler underflow and with one do not; activations that grow
x1.1 a step are reported before they overflow; the defaults watch what the run computes in."""

from __future__ import annotations

import math
import pathlib
from typing import Any

import pytest
import torch
from helpers import MLP
from precision.reference import RowSink, cast_fractions
from torch import nn

import torch_sentinel
from torch_sentinel import NonFiniteError
from torch_sentinel.precision.formats import FORMATS, Format

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FMTS = list(FORMATS.values())
FMT_IDS = [f.name for f in FMTS]


def _scales(fmt: Format) -> list[float]:
    """Input scales: around the format's smallest subnormal, and near its largest value
    (bf16's is within 0.2% of float32's: far below it)."""
    top = 2.0**100 if fmt.name == "bf16" else fmt.max_finite / 8
    return [fmt.min_subnormal * 64, top]


@pytest.mark.parametrize("fmt", FMTS, ids=FMT_IDS)
def test_rows_equal_the_cast_of_the_outputs_and_gradients_the_model_made(fmt: Format) -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    seen: dict[tuple[int, str], torch.Tensor] = {}
    step = [0]
    for name in ("fc1", "fc2", "head"):
        getattr(model, name).register_forward_hook(
            lambda m, a, out, name=name: seen.__setitem__((step[0], name), out.detach().clone()))
    sink = RowSink()
    g = torch.Generator().manual_seed(0)
    with torch_sentinel.attach(model, opt, precision=(fmt.name,), on_nonfinite="record") as s:
        s.add_sink(sink)
        for step[0], scale in enumerate(_scales(fmt)):
            x = torch.randn(64, 20, generator=g) * scale
            opt.zero_grad()
            model(x).mean().backward()
            for name in ("fc1", "fc2", "head"):
                grads = [p.grad.flatten() for p in getattr(model, name).parameters()]
                seen[(step[0], name + ".grad")] = torch.cat(grads).clone()
            opt.step()
    assert {(r.format, r.tensor) for r in sink.rows} == {(fmt.name, "activation"), (fmt.name, "gradient")}
    checked = 0
    for r in sink.rows:
        key = (r.step, r.module + (".grad" if r.tensor == "gradient" else ""))
        if key in seen:
            assert (r.flushed, r.subnormal, r.saturated) == pytest.approx(cast_fractions(seen[key], fmt), abs=0), key
            finite = seen[key][torch.isfinite(seen[key])]
            assert r.amax == finite.abs().max().item()
            checked += 1
    assert checked == 12
    assert any(r.flushed > 0 or r.subnormal > 0 for r in sink.rows)


def _underflow_run(loop: str, steps: int = 12) -> torch_sentinel.Report:
    """An MLP regressing with a tiny loss: in fp16 its weight gradients sit at the bottom of
    the range (~2**-24) and below."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    if loop == "fp16 weights":
        model = model.half()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", enabled=loop == "autocast fp16 + GradScaler")
    g = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if loop == "autocast bf16" else torch.float16
    sink = RowSink()
    with torch_sentinel.attach(model, opt, flush_every=5, disable={"update_ratio", "plateau"}) as s:
        s.add_sink(sink)
        for _ in range(steps):
            x, y = torch.randn(256, 32, generator=g), torch.randn(256, 1, generator=g)
            if loop == "fp16 weights":
                x, y = x.half(), y.half()
            opt.zero_grad()
            with torch.autocast("cpu", dtype=dtype, enabled=loop != "fp16 weights"):
                loss = nn.functional.mse_loss(model(x).float(), y.float()) * 1e-4
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        report = s.report()
    assert sink.formats == (("bf16",) if loop == "autocast bf16" else ("fp16",)) == (sink.compute_format,)
    return report


@pytest.mark.parametrize("loop", ["autocast fp16", "fp16 weights"], ids=["autocast", "half-weights"])
def test_fp16_gradients_without_a_grad_scaler_underflow(loop: str) -> None:
    report = _underflow_run(loop)
    found = report.by_kind("precision_underflow")
    assert {f.module for f in found} == {"0", "2", "4"}
    for f in found:
        assert f.severity == "warning" and f.boundary == "gradients"
        assert f.evidence["format"] == "fp16" and f.evidence["tensor"] == "gradient"
        assert f.evidence["flushed"] >= 0.01 and f.evidence["flushed_basis"] == "extrapolated"
        assert set(f.evidence) >= {"format", "tensor", "amax", "headroom_bits", "flushed"}


@pytest.mark.parametrize("loop", ["autocast fp16 + GradScaler", "autocast bf16"], ids=["grad-scaler", "bf16"])
def test_scaled_fp16_and_bf16_gradients_do_not(loop: str) -> None:
    report = _underflow_run(loop)
    assert [f for f in report.findings if f.kind.startswith("precision")] == []


def _grow(fmt: Format, overflow_at: int, steps: int, compute: bool = False) -> tuple[torch_sentinel.Sentinel, int, int]:
    """A bias-free linear stack whose input grows x1.1 a step, scaled so that its first layer's
    output first rounds above ``fmt``'s largest value at ``overflow_at``. Returns the sentinel,
    the step it really did (measured on every step) and the steps run."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32, bias=False), nn.Tanh(), nn.Linear(32, 4, bias=False))
    with torch.no_grad():
        model[0].weight.mul_(16.0)  # its output, not the input, reaches the edge first
    x0 = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
    edge = fmt.edges["overflow"].value
    start = edge / (model[0](x0).abs().max().item() * 1.1**overflow_at) * 1.01
    first = [-1]

    def check(module: nn.Module, args: object, out: torch.Tensor) -> None:
        if first[0] < 0 and bool((out.float().abs() > edge).any() | ~torch.isfinite(out).all()):
            first[0] = sentinel.step

    model[0].register_forward_hook(check)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    options = {} if compute else {"precision": (fmt.name,)}
    sentinel = torch_sentinel.attach(model, opt, flush_every=5, disable={"no_update"}, **options)
    ran = 0
    try:
        for step in range(steps):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=fmt.dtype, enabled=compute):
                model(x0 * (start * 1.1**step)).float().mean().backward()
            opt.step()
            ran += 1
    except NonFiniteError:
        pass
    sentinel.flush()
    return sentinel, first[0], ran


@pytest.mark.parametrize("fmt", FMTS, ids=FMT_IDS)
def test_activations_growing_are_reported_before_they_overflow(fmt: Format) -> None:
    sentinel, actual, _ = _grow(fmt, overflow_at=60, steps=50)
    (found,) = [f for f in sentinel.findings if f.kind == "precision_overflow" and f.module == "0"]
    sentinel.detach()
    assert actual == -1  # the run stopped before: the finding is a prediction
    assert found.severity == "info" and found.boundary == "forward"  # a float32 run: what a cast would meet
    assert found.evidence["format"] == fmt.name and found.evidence["tensor"] == "activation"
    assert found.evidence["predicted_overflow_step"] == pytest.approx(60, abs=2)
    assert found.step <= 60 - 10
    assert found.evidence["headroom_bits"] == pytest.approx(math.log2(fmt.max_finite / found.evidence["amax"]))


def test_fp16_activations_growing_are_a_warning_before_the_nonfinite_error() -> None:
    fmt = FORMATS["fp16"]
    sentinel, actual, _ = _grow(fmt, overflow_at=40, steps=60, compute=True)
    found = [f for f in sentinel.findings if f.kind == "precision_overflow" and f.module == "0"]
    nonfinite = [f for f in sentinel.findings if f.kind == "non_finite"]
    sentinel.detach()
    assert actual == 40 and nonfinite and nonfinite[0].step >= 40  # the fp16 output went inf at step 40
    (f,) = found
    assert f.severity == "warning" and "turn into inf" in f.message
    assert f.evidence["predicted_overflow_step"] == pytest.approx(40, abs=2) and f.step <= 30


def _watched(model: nn.Module, steps: int = 2, **options: Any) -> RowSink:
    """What a sentinel with ``options`` watched on ``steps`` sampled steps of ``model``."""
    sink = RowSink()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dtype = next(model.parameters()).dtype
    with torch_sentinel.attach(model, opt, **options) as s:
        s.add_sink(sink)
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(8, 20, dtype=dtype)).float().sum().backward()
            opt.step()
    return sink


def test_defaults_watch_the_dtype_the_run_computes_in(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(0)
    fp32 = _watched(MLP(), log_dir=str(tmp_path / "fp32"))
    assert fp32.facts == 0 and not (tmp_path / "fp32" / "precision.jsonl").exists()  # float32: nothing
    bf16 = _watched(MLP().to(torch.bfloat16))
    assert (bf16.formats, bf16.compute_format) == (("bf16",), "bf16") and bf16.facts == 2
    assert _watched(MLP().to(torch.float16), precision=()).facts == 0
    asked = _watched(MLP().to(torch.float16), precision=("e4m3", torch.float8_e5m2, "e4m3fn"))
    assert (asked.formats, asked.compute_format) == (("e4m3", "e5m2"), "fp16")
    assert {r.format for r in asked.rows} == {"e4m3", "e5m2"} and not any(r.compute for r in asked.rows)
