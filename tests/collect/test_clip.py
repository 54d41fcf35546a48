"""Gradient norms before clipping: what clip_grad_norm_ saw, in every way a loop calls it."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.nn.utils import clip_grad_norm_  # bound before attach: must still be seen

import torch_sentinel
from torch_sentinel.testing import count_host_syncs


def scalars(log_dir: Path, tag: str) -> list[float]:
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars(tag)]


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))


def total_norm(m: nn.Module) -> float:
    return torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in m.parameters()])).item()


CLIPS: dict[str, Callable[[nn.Module], torch.Tensor]] = {
    "imported_name": lambda m: clip_grad_norm_(m.parameters(), 1.0),
    "module_attribute": lambda m: torch.nn.utils.clip_grad_norm_(list(m.parameters()), 1.0, foreach=False),
    "get_total_norm_then_clip": lambda m: _two_calls(m),
}


def _two_calls(m: nn.Module) -> torch.Tensor:
    norm = torch.nn.utils.get_total_norm([p.grad for p in m.parameters()])
    torch.nn.utils.clip_grads_with_norm_(m.parameters(), 1.0, norm)
    return norm


@pytest.mark.parametrize("clip", list(CLIPS), ids=list(CLIPS))
def test_global_norm_is_the_one_the_clip_saw_and_the_clipped_one_is_kept(tmp_path: Path, clip: str) -> None:
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    seen, after = [], []
    with torch_sentinel.attach(m, opt, log_dir=str(tmp_path)):
        for _ in range(4):
            opt.zero_grad()
            (m(torch.randn(8, 4, generator=g)) * 50).pow(2).mean().backward()
            seen.append(CLIPS[clip](m).item())
            after.append(total_norm(m))
            opt.step()
    assert min(seen) > 10  # clipping really happened
    assert scalars(tmp_path, "grad_norm/global") == pytest.approx(seen, rel=1e-5)
    assert scalars(tmp_path, "grad_norm/global_clipped") == pytest.approx(after, rel=1e-5)
    # Per-module norms are before clipping too: together they make the global one.
    per_module = zip(scalars(tmp_path, "grad_norm/0"), scalars(tmp_path, "grad_norm/2"))
    assert [(a * a + b * b) ** 0.5 for a, b in per_module] == pytest.approx(seen, rel=1e-5)


def test_unscaled_under_amp(tmp_path: Path) -> None:
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    g = torch.Generator().manual_seed(0)
    seen = []
    with torch_sentinel.attach(m, opt, log_dir=str(tmp_path)):
        for _ in range(3):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = (m(torch.randn(8, 4, generator=g)) * 50).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            seen.append(clip_grad_norm_(m.parameters(), 1.0).item())
            scaler.step(opt)
            scaler.update()
    assert min(seen) > 10
    assert scalars(tmp_path, "grad_norm/global") == pytest.approx(seen, rel=1e-5)


def test_a_clip_of_another_models_parameters_is_ignored(tmp_path: Path) -> None:
    m, other = model(), model()
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    with torch_sentinel.attach(m, opt, log_dir=str(tmp_path)):
        opt.zero_grad()
        x = torch.randn(8, 4, generator=g)
        (m(x) * 50).pow(2).mean().backward()
        (other(x) * 50).pow(2).mean().backward()
        clip_grad_norm_(other.parameters(), 1.0)
        expected = total_norm(m)
        opt.step()
    assert scalars(tmp_path, "grad_norm/global") == pytest.approx([expected], rel=1e-5)
    assert not [t for t in EventAccumulator(str(tmp_path)).Reload().Tags()["scalars"] if t.endswith("_clipped")]


def test_exploding_gradient_is_seen_through_clipping() -> None:
    """Regression: norms read after clip_grad_norm_(..., 1.0) stayed at 1.0 and the detector was blind."""
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=1e-6)
    g = torch.Generator().manual_seed(0)
    with torch_sentinel.attach(m, opt, flush_every=4) as sentinel:
        for step in range(12):
            opt.zero_grad()
            (m(torch.randn(8, 4, generator=g)) * 10.0**step).pow(2).mean().backward()
            clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
        report = sentinel.report(all_ranks=False)
    assert report.by_kind("exploding_gradient"), str(report)


def test_observing_the_clip_adds_no_host_read() -> None:
    def audited(attach: bool) -> dict:
        m = model()
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        s = torch_sentinel.attach(m, opt, check="deferred", flush_every=1000) if attach else None
        g = torch.Generator().manual_seed(0)
        batches = [torch.randn(8, 4, generator=g) for _ in range(5)]
        with count_host_syncs() as syncs:
            for x in batches:
                opt.zero_grad()
                (m(x) * 50).pow(2).mean().backward()
                clip_grad_norm_(m.parameters(), 1.0)
                opt.step()
        if s is not None:
            s.detach()
        return dict(syncs.ops)

    assert audited(True) == audited(False)
