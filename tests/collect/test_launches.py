"""Kernel-launching ops the sentinel adds per module per step, counted at the dispatcher.

On a GPU the hot path's cost is counted in kernel launches; on CPU each launching op is one
dispatcher call, so a TorchDispatchMode counts them one for one (views, ``detach`` and
allocations launch nothing and are not counted). Averaged over ten steps after the first ten
(which are all sampled), so one sampled step in ten is included, as in a long run. Not timed.

The count is of the accelerator path, in both check modes: module outputs and output gradients
reduced with one multi-tensor op per boundary (``_collect/batch.py``, the fused strategy, forced
on CPU here). On
CPU the sentinel uses one ``aminmax`` per tensor at the boundary instead, where there are no
launches to save and CPU ``_foreach`` kernels are slower than ``aminmax``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn

from torch_sentinel.testing import ViewCounter, count_launches

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks.fixed_cost import added_launches, gpt2_4, stack100  # noqa: E402

#: What the sentinel adds now, per module per step (deferred mode, the accelerator default).
#: Issue 13 measured 0.90 (stack) and 1.46 (GPT-2) with one reduction per module; the target was
#: <= 0.5. Batched: 0.45 and 0.32; with the sampled saturation fractions batched too (they were
#: 5 ops per Tanh on one step in ten, now a few per boundary) the stack adds 0.21. Immediate mode
#: (sparse module hooks, rerun on a fault) adds 0.22 and 0.34 on the same ten steps.
LIMITS = {"stack100": 0.3, "gpt2-4": 0.4}

Build = Callable[[], tuple[nn.Module, Callable[[int], torch.Tensor]]]


def _stack() -> tuple[nn.Module, Callable[[int], torch.Tensor]]:
    """100 modules: Linear(16)/Tanh pairs, where per-module costs dominate (the benchmark's)."""
    return stack100()


def _gpt2() -> tuple[nn.Module, Callable[[int], torch.Tensor]]:
    """A 4-layer HF GPT-2 from a config (no download), 60 modules (the benchmark's)."""
    pytest.importorskip("transformers")
    return gpt2_4()


def added_launches_per_module(build: Build, warm: int = 10, steps: int = 10, check: str = "deferred",
                              disable: frozenset[str] = frozenset()) -> tuple[float, int, dict[str, Any]]:
    """(sentinel - bare) launching ops per module per step, the module count and the ops added
    per step, on steps without a flush (the benchmark's counter, on the fused path)."""
    r = added_launches(build, True, check, disable, warm=warm, steps=steps, flush_every=1000)
    return r["per_module"], r["modules"], r["ops"]


def test_the_counter_leaves_out_views_detach_and_allocations() -> None:
    x = torch.randn(4, 4)
    with count_launches() as c:
        x.view(16)
        x.detach()
        x.t()
        torch.empty(3)
        torch.aminmax(x)
        torch._foreach_norm([x, x, x])
    assert dict(c.ops) == {"aminmax": 1, "_foreach_norm": 1}


@pytest.mark.parametrize("check", ["deferred", "immediate"], ids=["deferred", "immediate"])
@pytest.mark.parametrize("name", list(LIMITS), ids=list(LIMITS))
def test_launching_ops_added_per_module_per_step(name: str, check: str) -> None:
    build = {"stack100": _stack, "gpt2-4": _gpt2}[name]
    # The loss_spike probe's launches are per step, not per module: see the next test.
    per_module, modules, added = added_launches_per_module(build, check=check, disable=frozenset({"loss_spike"}))
    assert modules == {"stack100": 101, "gpt2-4": 60}[name]
    assert 0 < per_module <= LIMITS[name], f"{per_module:.3f} per module per step; added ops: {added}"


#: The CPU path a CPU user runs (``check="auto"``, the loop strategy), every detector on: the
#: issue-22 target is 0.5 on the stack (0.38 measured). GPT-2 without ``loss_spike`` (0.57
#: measured): its custom blocks' 35 output gradients a step, three shapes, are stacked per shape
#: (one aminmax per tensor was 0.97).
CPU_LIMITS = {"stack100": (0.5, frozenset()), "gpt2-4": (0.65, frozenset({"loss_spike"}))}


@pytest.mark.parametrize("name", list(CPU_LIMITS), ids=list(CPU_LIMITS))
def test_launching_ops_added_per_module_per_step_on_the_cpu_path(name: str) -> None:
    build = {"stack100": _stack, "gpt2-4": _gpt2}[name]
    limit, disable = CPU_LIMITS[name]
    r = added_launches(build, False, "auto", disable, warm=110, steps=20, flush_every=1000)
    assert 0 < r["per_module"] <= limit, f"{r['per_module']:.3f} per module per step; added ops: {r['ops']}"


def _stack50() -> tuple[nn.Module, Callable[[int], torch.Tensor]]:
    model = nn.Sequential(*[nn.Linear(16, 16) if i % 2 == 0 else nn.Tanh() for i in range(50)])
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 16, generator=g), torch.randn(4, 16, generator=g)
    return model, lambda i: nn.functional.mse_loss(model(x), y)


#: Launching ops the loss_spike probe adds per step: the spike ring's 6 (one _foreach_copy_ at
#: the pre-step; _foreach_sub_, two _foreach_norm, two stacks written into the ring's row), 5 for
#: the attention modules of one shape together at the end of the forward (a cat of their
#: queries and one of their keys, the scores, their max, an index_copy_ into the row), 5 for the
#: output log-sum-exp (two amax, log_softmax, a subtraction, the mean into the row) and 2 for the
#: largest token id. GPT-2 here: 4 attention modules of one shape, a vocabulary, token ids.
SPIKE_LAUNCHES = {"stack100": 6, "stack50": 6, "gpt2-4": 6 + 5 + 5 + 2}


@pytest.mark.parametrize("name", list(SPIKE_LAUNCHES), ids=list(SPIKE_LAUNCHES))
def test_the_loss_spike_probe_adds_a_fixed_count_per_step(name: str) -> None:
    """Whatever the number of modules, the ring costs the same per step."""
    build = {"stack100": _stack, "stack50": _stack50, "gpt2-4": _gpt2}[name]
    with_probe, modules, _ = added_launches_per_module(build)
    without, _, _ = added_launches_per_module(build, disable=frozenset({"loss_spike"}))
    assert round((with_probe - without) * modules, 6) == SPIKE_LAUNCHES[name]


#: View ops (metadata only: no launch, but each one a dispatcher call) the loss_spike probe
#: adds per step on the CPU path: per attention module the first sequence of q and of k (a
#: select each); per group of them, the keys' transpose and the scores' view; the
#: logits' first sequence.
#: Nothing per parameter: the ring's row views are made once, norms reduce over dims without a
#: flattening view, and nothing is detached under no_grad (it was 40 views on GPT-2, 10 on the
#: stack).
SPIKE_VIEWS = {"stack100": {}, "gpt2-4": {"select": 2 * 4 + 1, "transpose": 1, "view": 1}}


def _views_per_step(build: Build, disable: frozenset[str]) -> dict[str, float]:
    """Views the sentinel adds per step over the bare loop, on the CPU path, past step 120 (the
    ordinary steps of a long run)."""
    r = added_launches(build, False, "auto", disable, warm=121, steps=5, counter=ViewCounter, flush_every=1000)
    return r["ops"]


@pytest.mark.parametrize("name", list(SPIKE_VIEWS), ids=list(SPIKE_VIEWS))
def test_the_loss_spike_probe_adds_no_view_per_parameter(name: str) -> None:
    build = {"stack100": _stack, "gpt2-4": _gpt2}[name]
    with_probe = _views_per_step(build, frozenset())
    without = _views_per_step(build, frozenset({"loss_spike"}))
    added = {k: with_probe.get(k, 0) - without.get(k, 0) for k in set(with_probe) | set(without)}
    assert {k: v for k, v in added.items() if v} == SPIKE_VIEWS[name]
