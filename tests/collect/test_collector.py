"""Device-side collection: what reaches the host per step, without host reads in the hot path."""

from __future__ import annotations

import gc
import math
import tracemalloc
import weakref

import pytest
import torch
from helpers import MLP, MODELS, make_batch, train
from torch import nn

import torch_sentinel
from torch_sentinel._collect.collector import Collector
from torch_sentinel._record import StepRecord
from torch_sentinel.testing import count_host_syncs


def _collector(model: nn.Module, opts: list[torch.optim.Optimizer], immediate: bool = False, update_every: int = 0):
    records: list[StepRecord] = []
    c = Collector(model, opts, immediate=immediate, update_every=update_every, on_record=records.append)
    c.install()
    return c, records


def test_loss_is_captured_from_loss_backward() -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    c, records = _collector(model, [opt])
    try:
        losses = train(model, opt, "mlp", 5)
    finally:
        c.close()
    assert [r.step for r in records] == [0, 1, 2, 3, 4]
    assert [r.loss for r in records] == pytest.approx(losses, rel=1e-6)
    assert [r.meta.backward_calls for r in records] == [1] * 5


def test_gradient_accumulation_records_the_summed_objective_per_optimizer_step() -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    c, records = _collector(model, [opt])
    g = torch.Generator().manual_seed(1)
    expected = []
    try:
        for _ in range(3):
            opt.zero_grad()
            total = 0.0
            for _ in range(4):  # four micro-batches per optimizer step
                x, y = make_batch("mlp", n=4, generator=g)
                loss = nn.functional.cross_entropy(model(x), y) / 4
                loss.backward()
                total += loss.item()
            opt.step()
            expected.append(total)
    finally:
        c.close()
    assert [r.meta.backward_calls for r in records] == [4, 4, 4]
    assert [r.loss for r in records] == pytest.approx(expected, rel=1e-5)
    assert all(r.meta.stale_grads == 0 for r in records)  # zero_grad(set_to_none=True) ran


def test_explicit_loss_wins_over_the_captured_one() -> None:
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    c, records = _collector(model, [opt])
    try:
        opt.zero_grad()
        loss = model(torch.randn(4, 20)).pow(2).mean()
        c.observe_loss(torch.tensor(7.5))
        loss.backward()
        opt.step()
    finally:
        c.close()
    assert records[0].loss == 7.5


def test_grad_and_param_norms_match_torch() -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    c, records = _collector(model, [opt], update_every=1)
    try:
        opt.zero_grad()
        model(torch.randn(8, 20)).pow(2).mean().backward()
        grad_norms = {n: p.grad.norm().item() for n, p in model.named_parameters()}
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.step()
    finally:
        c.close()
    rec = records[0]
    assert rec.mapping("grad_norm") == pytest.approx(grad_norms, rel=1e-5)
    # Weight norms are taken before the update: the weights the step found.
    assert rec.mapping("param_norm") == pytest.approx({n: p.norm().item() for n, p in before.items()}, rel=1e-5)
    assert rec.meta.weights_recorded
    assert rec.mapping("update_norm") == pytest.approx(
        {n: (p.detach() - before[n]).norm().item() for n, p in model.named_parameters()}, rel=1e-4)
    assert rec.meta.updates_sampled


@pytest.mark.parametrize("change", ["view", "resize"], ids=["same-size-new-shape", "new-size"])
def test_update_norms_stay_exact_when_a_parameter_changes_shape_between_sampled_updates(change: str) -> None:
    """The exact update norm reuses its copy of the weights from one sampled update to the next,
    checked by element count: a weight given another shape of the same size (``.data`` viewed
    with a leading 1) or another size between two of them is measured on what it is now."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 6))
            self.v = nn.Parameter(torch.randn(5))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x @ self.w.T).pow(2).mean() + self.v.pow(2).sum()

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c, records = _collector(model, [opt], update_every=1)
    expected = []
    try:
        for step in range(4):
            if step == 2:
                model.v.data = model.v.data.view(1, 5) if change == "view" else torch.randn(7)
            opt.zero_grad()
            model(torch.randn(8, 6)).backward()
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            opt.step()
            expected.append({n: float((p.detach() - before[n]).norm()) for n, p in model.named_parameters()})
    finally:
        c.close()
    assert len(records) == 4
    for rec, want in zip(records, expected):
        assert rec.meta.updates_sampled
        assert rec.mapping("update_norm") == pytest.approx(want, rel=1e-5), rec.step


def test_missing_grads_and_frozen_parameters_are_host_facts() -> None:
    model = MLP()
    model.fc1.requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    c, records = _collector(model, [opt])
    try:
        opt.zero_grad()
        model(torch.randn(8, 20)).pow(2).mean().backward()
        opt.step()
    finally:
        c.close()
    meta = records[0].meta
    assert set(meta.grad_missing) == {"fc1.weight", "fc1.bias"}
    assert set(meta.frozen) == {"fc1.weight", "fc1.bias"}
    assert records[0].mapping("grad_norm")["fc1.weight"] == 0.0
    assert records[0].mapping("grad_norm")["head.weight"] > 0


def test_missing_zero_grad_shows_as_stale_gradients() -> None:
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    c, records = _collector(model, [opt])
    try:
        for _ in range(3):
            model(torch.randn(8, 20)).pow(2).mean().backward()  # no zero_grad
            opt.step()
    finally:
        c.close()
    assert [r.meta.stale_grads for r in records] == [0, 6, 6]
    assert records[2].value("misc", "stale_grad_norm") > 0


def test_eval_passes_under_no_grad_leave_the_training_row_alone() -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    c, records = _collector(model, [opt])
    try:
        train(model, opt, "mlp", 1)
        model.eval()
        with torch.no_grad():
            model(torch.full((4, 20), 1e6))  # would change data max if recorded
        model.train()
        train(model, opt, "mlp", 1, seed=3)
    finally:
        c.close()
    assert records[1].meta.forward_calls == 1
    assert records[1].value("data.max", "inputs") < 100


def test_scaler_skipped_steps_are_recorded_not_faults_and_loss_is_unscaled() -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=3e38, backoff_factor=0.01, growth_interval=1000)
    sentinel = torch_sentinel.attach(model, opt, check="immediate")
    g = torch.Generator().manual_seed(0)
    losses = []
    skipped = []
    try:
        for _ in range(6):
            x, y = make_batch("mlp", generator=g)
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                # weighted so that scaled gradients overflow float32 for the first few scales
                loss = 300 * nn.functional.cross_entropy(model(x), y)
            scale_before = scaler.get_scale()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            skipped.append(scaler.get_scale() < scale_before)
            losses.append(loss.item())
        records = sentinel.recent_records()
    finally:
        sentinel.detach()
    assert any(skipped) and not all(skipped)
    assert [r.meta.amp_skipped for r in records] == skipped
    assert all(r.meta.amp for r in records)
    assert [r.loss for r in records] == pytest.approx(losses, rel=1e-2)
    assert sentinel.report().by_kind("non_finite") == []


@pytest.mark.parametrize("kind", ["mlp", "cnn", "transformer"], ids=["mlp", "cnn", "transformer"])
@pytest.mark.parametrize("mode", ["deferred", "immediate"], ids=["deferred", "immediate"])
def test_instrumented_loop_makes_no_more_host_reads_than_the_bare_loop(kind: str, mode: str) -> None:
    def audited(attach: bool) -> dict:
        torch.manual_seed(0)
        model = MODELS[kind]()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        s = torch_sentinel.attach(model, opt, check=mode, flush_every=1000) if attach else None
        train(model, opt, kind, 2)  # warm-up: first-call bookkeeping
        g = torch.Generator().manual_seed(5)
        batches = [make_batch(kind, generator=g) for _ in range(5)]
        with count_host_syncs() as syncs:
            for x, y in batches:
                opt.zero_grad()
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
        if s is not None:
            s.detach()
        return dict(syncs.ops)

    assert audited(True) == audited(False)


def test_the_audit_does_count_host_reads() -> None:
    x = torch.randn(10)
    with count_host_syncs() as syncs:
        x.sum().item()
        bool(x.max() > 0)
        x[x > 0]
        torch.nonzero(x)
    assert syncs.ops["_local_scalar_dense"] == 2
    assert syncs.ops["nonzero"] >= 1
    assert syncs.count >= 4


def test_no_activation_outlives_its_step() -> None:
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    refs = []
    model.fc2.register_forward_hook(lambda m, a, out: refs.append(weakref.ref(out)))
    with torch_sentinel.attach(model, opt, check="deferred"):
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(8, 20)).pow(2).mean().backward()
            opt.step()
        gc.collect()
        assert all(r() is None for r in refs)


def test_memory_stays_flat_over_two_thousand_steps() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(4, 8), torch.randn(4, 2)

    def steps(n: int) -> None:
        for _ in range(n):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()

    # Tracing starts before the warm-up: objects made after a start that replace older,
    # untraced ones in a full bounded buffer would otherwise count as growth (a 1024-row
    # deque turning over reads as +260 KiB while the process holds the same memory).
    tracemalloc.start()
    try:
        with torch_sentinel.attach(model, opt, check="deferred", flush_every=50) as s:
            steps(1000)  # warm-up fills the bounded buffers (the longest hold 256-1024 steps)
            gc.collect()
            base, _ = tracemalloc.get_traced_memory()
            steps(2000)
            gc.collect()
            current, _ = tracemalloc.get_traced_memory()
            assert s.step == 3000
    finally:
        tracemalloc.stop()
    assert current - base < 64 * 1024, f"grew by {(current - base) / 1024:.0f} KiB over 2000 steps"


def test_two_optimizers_close_one_row_per_iteration() -> None:
    gen, disc = nn.Linear(4, 8), nn.Linear(8, 1)
    model = nn.ModuleDict({"gen": gen, "disc": disc})
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
    c, records = _collector(model, [opt_g, opt_d])
    try:
        for _ in range(3):
            opt_d.zero_grad()
            disc(gen(torch.randn(4, 4)).detach()).mean().backward()
            opt_d.step()
            opt_g.zero_grad()
            (-disc(gen(torch.randn(4, 4))).mean()).backward()
            opt_g.step()
    finally:
        c.close()
    assert [r.step for r in records] == [0, 1, 2]
    assert [r.meta.backward_calls for r in records] == [2, 2, 2]


def test_float32_norm_overflow_of_finite_values_is_not_called_non_finite() -> None:
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with torch.no_grad():
        model.weight.fill_(1e30)  # finite, but its L2 norm overflows float32
    with torch_sentinel.attach(model, opt, check="deferred") as s:
        opt.zero_grad()
        model(torch.randn(2, 4)).mean().backward()
        opt.step()
    assert s.report().by_kind("non_finite") == []
    assert math.isfinite(s.recent_records()[-1].value("param_norm", "weight"))
    assert s.recent_records()[-1].meta.norm_overflow == ["weight"]


class _Sqrt(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x.abs())


@pytest.mark.parametrize(
    ("layers", "watched"),
    [
        (lambda: [nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4, 2)],
         {"5"}),
        (lambda: [nn.Flatten(), nn.Linear(48, 8), nn.ReLU(), _Sqrt(), nn.Linear(8, 2)], {"2", "3", "4"}),
    ],
    ids=["standard-layers-only-the-last", "around-a-custom-module"],
)
def test_output_gradients_are_watched_where_a_backward_could_create_non_finite_values(layers, watched) -> None:
    model = nn.Sequential(*layers())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    c, records = _collector(model, [opt])
    try:
        for _ in range(12):
            opt.zero_grad()
            model(torch.randn(2, 3, 4, 4)).pow(2).mean().backward()
            opt.step()
    finally:
        c.close()
    names = c.module_names
    # Steps 0-9 (and every tenth) reduce every output gradient; step 11 only the planned ones.
    assert records[5].meta.outgrad_complete and not records[11].meta.outgrad_complete
    assert {names[i] for i in records[11].meta.bwd_order} == watched
    assert {names[i] for i in records[5].meta.bwd_order} >= watched | {"1"}
