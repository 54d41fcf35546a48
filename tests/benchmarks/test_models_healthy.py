"""The benchmark's models compute on ordinary floats and train without faults.

A model whose signal shrinks with depth ends up computing on subnormal floats, which x86 CPUs
process tens of times slower: the bare step then times denormal arithmetic, and every overhead
ratio measured against it looks better than it is. This happened to the scaling stack with
PyTorch's default init (the gradient vanished into subnormals past a few hundred modules).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch_sentinel  # noqa: E402
from benchmarks import models as bench_models  # noqa: E402
from benchmarks import overhead  # noqa: E402

CPU = torch.device("cpu")


def _subnormal_count(t: torch.Tensor) -> int:
    tiny = torch.finfo(t.dtype).tiny
    return int(((t != 0) & (t.abs() < tiny)).sum())


def _forward_backward(
    workload: bench_models.Workload,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every leaf module's output and the gradient that reaches it, over one training step."""
    model = workload.model
    outputs: list[torch.Tensor] = []
    out_grads: list[torch.Tensor] = []

    def keep(module: torch.nn.Module, args: object, out: object) -> None:
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            outputs.append(out.detach())
            if out.requires_grad:
                out.register_hook(lambda g: out_grads.append(g.detach()))

    leaves = [m for m in model.modules() if not any(True for _ in m.children())]
    handles = [m.register_forward_hook(keep) for m in leaves]
    try:
        x, y = workload.batch(0)
        workload.loss_fn(model(x), y).backward()
    finally:
        for h in handles:
            h.remove()
    return outputs, out_grads


def _assert_no_subnormals(workload: bench_models.Workload) -> None:
    outputs, out_grads = _forward_backward(workload)
    param_grads = [p.grad for p in workload.model.parameters() if p.grad is not None]
    assert outputs and out_grads and param_grads
    for what, tensors in (
        ("activations", outputs),
        ("gradients of activations", out_grads),
        ("parameter gradients", param_grads),
    ):
        found = sum(_subnormal_count(t) for t in tensors)
        assert found == 0, f"{workload.description}: {found} subnormal values in its {what}"


@pytest.mark.parametrize("n_modules", sorted({100, *overhead.Config.scaling}))
def test_scaling_stack_computes_on_normal_floats(n_modules: int) -> None:
    torch.manual_seed(0)
    _assert_no_subnormals(bench_models.deep_stack(CPU, n_modules))


def test_scaling_stack_keeps_its_signal_scale_with_depth() -> None:
    """Stronger than the subnormal check, and at 100 modules already: with the default init the
    gradient at the first layer is ~1e-12 of the last one's here, on its way to subnormals."""
    torch.manual_seed(0)
    workload = bench_models.deep_stack(CPU, 100)
    outputs, out_grads = _forward_backward(workload)
    rms = [float(t.pow(2).mean().sqrt()) for t in outputs]
    assert min(rms) > 0.05, f"activation rms falls to {min(rms):.3g}"
    # out_grads arrive in backward order: the last module's first
    ratio = float(out_grads[-1].norm() / out_grads[0].norm())
    assert 0.1 < ratio < 10, f"first/last output-gradient norm ratio {ratio:.3g}"


@pytest.mark.parametrize("name", sorted(bench_models.CPU_MODELS))
def test_cpu_benchmark_models_compute_on_normal_floats(name: str) -> None:
    _assert_no_subnormals(bench_models.build(name, CPU))


def test_sentinel_finds_nothing_on_the_scaling_stack() -> None:
    """The stack is a healthy network: a finding on it (the default init gave
    ``vanishing_gradient`` at step 9) means the benchmark times a broken model."""
    torch.manual_seed(0)
    workload = bench_models.deep_stack(CPU, 100)
    model = workload.model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)  # as the benchmark trains it
    sentinel = torch_sentinel.attach(model, optimizer)
    try:
        for i in range(20):
            x, y = workload.batch(i)
            optimizer.zero_grad(set_to_none=True)
            workload.loss_fn(model(x), y).backward()
            optimizer.step()
        sentinel.flush()
        assert sentinel.findings == []
    finally:
        sentinel.detach(quiet=True)
