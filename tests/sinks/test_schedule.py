"""Bounded TensorBoard volume: global tags every step, per-module tags at an interval, full at a fault."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

import torch_sentinel
from torch_sentinel.sinks.schedule import MODULE_BYTES_PER_STEP, auto_interval


@pytest.mark.parametrize(
    ("tag_bytes", "interval"),
    [(0, 1), (MODULE_BYTES_PER_STEP, 1), (MODULE_BYTES_PER_STEP + 1, 2), (9_000, 5), (11_000, 10), (150_000, 100)],
    ids=["none", "at_budget", "just_over", "five", "ten", "hundred"],
)
def test_auto_interval_is_the_smallest_round_interval_within_budget(tag_bytes: int, interval: int) -> None:
    assert auto_interval(tag_bytes) == interval


class Wide(nn.Module):
    """62 small layers side by side (no vanishing gradient through depth): 125 modules, as
    many per-module tags as a 12-layer transformer."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.ModuleList(nn.Linear(4, 4) for _ in range(62))
        self.act = nn.ModuleList(nn.Tanh() for _ in range(60))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(self.act[i % 60](lin(x)) for i, lin in enumerate(self.lin))  # type: ignore[return-value]


def train(log_dir: Path, steps: int, nan_at: int = -1) -> None:
    torch.manual_seed(0)
    model = Wide()
    assert len(list(model.modules())) == 125
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    with torch_sentinel.attach(model, opt, log_dir=str(log_dir), on_nonfinite="record", flush_every=7):
        for step in range(steps):
            x = torch.randn(8, 4, generator=g)
            if step == nan_at:
                x[0, 0] = float("nan")
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()


def scalars(log_dir: Path) -> dict[str, set[int]]:
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def event_bytes(log_dir: Path) -> int:
    return sum(f.stat().st_size for f in log_dir.glob("events.out.tfevents.*"))


def test_global_tags_every_step_module_tags_every_tenth_and_bytes_per_step(tmp_path: Path) -> None:
    train(tmp_path / "a", 5)
    train(tmp_path / "b", 15)
    tags = scalars(tmp_path / "b")
    assert tags["loss/train"] == tags["grad_norm/global"] == tags["nonfinite/forward"] == set(range(15))
    # ~190 per-module tags, ~9 KB per write: every 5th step (and the last step). Module output
    # maxima exist on sampled steps only (0-9, 10); the last step, 14, is an ordinary one.
    assert tags["grad_norm/lin.0"] == {0, 5, 10, 14}
    assert tags["activation_absmax/lin.61"] == {0, 5, 10}
    per_step = (event_bytes(tmp_path / "b") - event_bytes(tmp_path / "a")) / 10
    assert per_step <= 2500, per_step


def test_per_module_detail_around_a_fault_is_complete(tmp_path: Path) -> None:
    train(tmp_path, 17, nan_at=13)
    tags = scalars(tmp_path)
    # One interval (5 steps) up to the fault's step 13 gets its per-module tags.
    assert tags["grad_norm/lin.0"] == {0, 5, 9, 10, 11, 12, 13, 15, 16}
    # Output maxima on the sampled steps 9 and 10; ordinary steps 11-13 have none to write (the
    # NaN at 13 is in the batch: found at the data boundary, with no module to localise).
    assert tags["activation_absmax/lin.61"] >= {9, 10}
    assert tags["loss/train"] == set(range(17))
