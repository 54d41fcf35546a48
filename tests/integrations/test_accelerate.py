"""accelerate's loop (CPU accelerator): the one-line attach after prepare()."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

accelerate = pytest.importorskip("accelerate")

import torch_sentinel  # noqa: E402


def test_backward_accumulate_and_clip_after_prepare(tmp_path: Path) -> None:
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt = accelerator.prepare(model, opt)
    sentinel = torch_sentinel.attach(model, opt, log_dir=str(tmp_path), flush_every=2)  # the one line
    g = torch.Generator().manual_seed(0)
    norms, losses, micro = [], [], []
    for _ in range(8):
        with accelerator.accumulate(model):
            loss = (model(torch.randn(8, 4, generator=g)) * 30).pow(2).mean()
            micro.append(loss.item())
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                norms.append(accelerator.clip_grad_norm_(model.parameters(), 1.0).item())
                losses.append(sum(micro) / len(micro))
                micro = []
            opt.step()
            opt.zero_grad()
    report = sentinel.report(all_ranks=False)
    sentinel.detach()
    assert report.ok, str(report)
    assert sentinel.step == 4  # optimizer steps, not micro-batches
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    acc.Reload()
    assert min(norms) > 1.0  # the clip really clipped
    assert [e.value for e in acc.Scalars("grad_norm/global")] == pytest.approx(norms, rel=1e-5)
    assert [e.value for e in acc.Scalars("grad_norm/global_clipped")] == pytest.approx([1.0] * 4, rel=1e-4)
    # accelerator.backward divides by the accumulation steps: the recorded loss is the mean.
    assert [e.value for e in acc.Scalars("loss/train")] == pytest.approx(losses, rel=1e-5)
    assert all(math.isfinite(e.value) for e in acc.Scalars("update_ratio/global"))


def test_nan_in_a_micro_batch_is_found_at_its_optimizer_step(tmp_path: Path) -> None:
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with torch_sentinel.attach(model, opt), pytest.raises(torch_sentinel.NonFiniteError, match=r"step 2, boundary 'data'"):
        for i in range(8):
            with accelerator.accumulate(model):
                x = torch.randn(8, 4)
                if i == 5:  # the second micro-batch of optimizer step 2
                    x[0, 0] = float("nan")
                accelerator.backward(model(x).pow(2).mean())
                opt.step()
                opt.zero_grad()
