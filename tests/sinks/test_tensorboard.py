"""TensorBoardSink: the values in the event files are the values the loop computed."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import MLP, make_batch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.hparams import plugin_data_pb2
from torch import nn

import torch_sentinel
from torch_sentinel import Finding
from torch_sentinel.sinks import SinkContext
from torch_sentinel.sinks.tensorboard import LAYOUT, TensorBoardSink


def load(log_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def series(acc: EventAccumulator, tag: str) -> dict[int, float]:
    return {e.step: e.value for e in acc.Scalars(tag)}


def logged_steps(log_dir: Path) -> list[int]:
    """The steps of ``loss/train`` on disk now ([] before the first one is)."""
    acc = load(log_dir)
    return sorted(series(acc, "loss/train")) if "loss/train" in acc.Tags()["scalars"] else []


def text(acc: EventAccumulator, tag: str) -> dict[int, str]:
    # SummaryWriter.add_text stores tag "x" as "x/text_summary", as TensorBoard's own writer does.
    return {
        e.step: e.tensor_proto.string_val[0].decode() for e in acc.Tensors(f"{tag}/text_summary")
    }


class Loop:
    """The user's loop on MLP, recording what it computed at each step."""

    def __init__(self, steps: int, *, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = MLP()
        self.opt = torch.optim.SGD(
            [
                {"params": self.model.fc1.parameters(), "name": "encoder"},
                {
                    "params": [*self.model.fc2.parameters(), *self.model.head.parameters()],
                    "lr": 0.05,
                },
            ],
            lr=0.1,
            momentum=0.9,
        )
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=3, gamma=0.5)
        self.steps = steps
        self.losses: list[float] = []
        self.lrs: list[list[float]] = []
        self.grad_global: list[float] = []
        self.grad_fc1: list[float] = []
        self.update_ratio_fc2: list[float] = []
        self.act_fc1: list[float] = []

    def run(self, corrupt_at: int = -1) -> None:
        g = torch.Generator().manual_seed(0)
        captured: list[float] = []
        # The test's own forward hook, registered before attach: what the layer really output.
        handle = self.model.fc1.register_forward_hook(
            lambda m, a, out: captured.append(out.detach().abs().max().item())
        )
        for step in range(self.steps):
            x, y = make_batch("mlp", generator=g)
            if step == corrupt_at:
                x[0, 0] = float("nan")
            self.opt.zero_grad()
            loss = nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
            grads = [p.grad for p in self.model.parameters()]
            self.grad_global.append(
                torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item()
            )
            self.grad_fc1.append(
                torch.cat([self.model.fc1.weight.grad.flatten(), self.model.fc1.bias.grad])
                .norm()
                .item()
            )
            before = [p.detach().clone() for p in self.model.fc2.parameters()]
            self.lrs.append([group["lr"] for group in self.opt.param_groups])
            self.opt.step()
            self.sched.step()
            after = list(self.model.fc2.parameters())
            delta = math.sqrt(sum(((a - b) ** 2).sum().item() for a, b in zip(after, before)))
            weight = math.sqrt(sum((b**2).sum().item() for b in before))  # the weights the step found
            self.update_ratio_fc2.append(delta / weight)
            self.losses.append(loss.item())
        handle.remove()
        self.act_fc1 = captured


@pytest.mark.parametrize("log_every", [1, 3], ids=["every_step", "every_3rd"])
def test_logged_values_are_the_loop_values(tmp_path: Path, log_every: int) -> None:
    loop = Loop(steps=10)
    with torch_sentinel.attach(
        loop.model,
        loop.opt,
        log_dir=str(tmp_path),
        flush_every=4,
        log_every=log_every,
        update_every=1,
    ):
        loop.run()
    acc = load(tmp_path)
    # Every log_every-th step, and the last step so that a run's end always shows.
    expected_steps = sorted({s for s in range(10) if s % log_every == 0} | {9})
    loss = series(acc, "loss/train")
    assert sorted(loss) == expected_steps
    for step in expected_steps:
        assert loss[step] == pytest.approx(loop.losses[step], rel=1e-6)
        assert series(acc, "lr/encoder")[step] == pytest.approx(loop.lrs[step][0])
        assert series(acc, "lr/group1")[step] == pytest.approx(loop.lrs[step][1])
        assert series(acc, "grad_norm/global")[step] == pytest.approx(
            loop.grad_global[step], rel=1e-5
        )
        assert series(acc, "grad_norm/fc1")[step] == pytest.approx(loop.grad_fc1[step], rel=1e-5)
        assert series(acc, "update_ratio/fc2")[step] == pytest.approx(
            loop.update_ratio_fc2[step], rel=1e-4
        )
        assert series(acc, "activation_absmax/fc1")[step] == pytest.approx(
            loop.act_fc1[step], rel=1e-6
        )
        assert series(acc, "nonfinite/forward")[step] == 0.0
    # The scheduler halved the lr: the logged lr follows it, so this is not a constant.
    assert series(acc, "lr/encoder")[9] == pytest.approx(0.1 * 0.5**3)


def test_validation_loss_is_logged_at_its_step(tmp_path: Path) -> None:
    loop = Loop(steps=1)
    with torch_sentinel.attach(
        loop.model, loop.opt, log_dir=str(tmp_path), log_every=5
    ) as sentinel:
        for step in range(7):
            if step in (2, 6):
                sentinel.observe_validation(0.5 + step)  # off the log_every grid on purpose
            loop.run()
    assert series(load(tmp_path), "loss/validation") == {2: 2.5, 6: 6.5}


def test_nonfinite_counts_and_findings_text(tmp_path: Path) -> None:
    loop = Loop(steps=6)
    with torch_sentinel.attach(
        loop.model, loop.opt, log_dir=str(tmp_path), on_nonfinite="record", check="deferred"
    ):
        loop.run(corrupt_at=3)
    acc = load(tmp_path)
    data = series(acc, "nonfinite/data")
    assert data[2] == 0.0 and data[3] >= 1.0
    shown = text(acc, "findings/non_finite")
    assert list(shown) == [3]
    assert "non_finite" in shown[3] and "(data)" in shown[3] and "next check" in shown[3]


def test_amp_skipped_steps_and_loss_scale(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    # A scale this large overflows the gradients for the first steps; the scaler skips them
    # and halves the scale each time, as a real fp16 run does at start.
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127, growth_interval=1000)
    g = torch.Generator().manual_seed(0)
    scales, skipped = [], []
    with torch_sentinel.attach(model, opt, log_dir=str(tmp_path), flush_every=4):
        for _ in range(8):
            x, y = make_batch("mlp", generator=g)
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(x), y) * 100
            scales.append(scaler.get_scale())
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            skipped.append(scaler.get_scale() < scales[-1])
    acc = load(tmp_path)
    counts = [sum(skipped[: i + 1]) for i in range(8)]
    assert 0 < counts[-1] < 8
    assert series(acc, "amp/skipped_steps") == {i: float(c) for i, c in enumerate(counts)}
    assert series(acc, "amp/loss_scale") == pytest.approx(dict(enumerate(scales)))


def test_no_amp_tags_without_amp(tmp_path: Path) -> None:
    loop = Loop(steps=3)
    with torch_sentinel.attach(loop.model, loop.opt, log_dir=str(tmp_path)):
        loop.run()
    assert not [t for t in load(tmp_path).Tags()["scalars"] if t.startswith("amp/")]


def test_manifest_text_hparams_and_layout(tmp_path: Path) -> None:
    ctx = SinkContext(log_dir=str(tmp_path), log_every=1, rank=None, is_writer=True)
    sink = TensorBoardSink(ctx)
    # The manifest is filled after the sink was built, as attach() does.
    ctx.manifest.update(
        {"seed": 7, "optimizer": {"type": "AdamW", "lr": 0.001}, "env": {"torch": "2.x"}}
    )
    sink.write([], [Finding(kind="plateau", boundary="curves", message="stalled", step=4)])
    sink.close()
    acc = load(tmp_path)
    assert '"AdamW"' in text(acc, "run/manifest")[0]
    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["optimizer/lr"].number_value == pytest.approx(0.001)
    assert hparams["optimizer/type"].string_value == "AdamW"
    assert hparams["seed"].number_value == 7
    layout = layout_pb2.Layout.FromString(
        acc.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0]
    )
    assert [c.title for c in layout.category] == list(LAYOUT)
    assert text(acc, "findings/plateau") == {4: text(acc, "findings/plateau")[4]}
    assert "stalled" in text(acc, "findings/plateau")[4]


def test_detector_statistics_with_dead_fraction_alias(tmp_path: Path) -> None:
    ctx = SinkContext(log_dir=str(tmp_path), log_every=1, rank=None, is_writer=True)
    sink = TensorBoardSink(ctx)
    sink.write_stats(
        5, {"detector/dead_relu/encoder.act.dead_fraction": 0.75, "detector/plateau/best": 1.5}
    )
    sink.close()
    acc = load(tmp_path)
    assert series(acc, "detector/dead_relu/encoder.act.dead_fraction") == {5: 0.75}
    assert series(acc, "dead_fraction/encoder.act") == {5: 0.75}
    assert series(acc, "detector/plateau/best") == {5: 1.5}


def test_dead_relu_fraction_streams_from_a_real_run(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MLP()
    with torch.no_grad():
        model.fc1.bias.fill_(-20.0)  # every unit of act starts and stays dead
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    with torch_sentinel.attach(model, opt, log_dir=str(tmp_path), flush_every=10):
        for _ in range(20):
            x, y = make_batch("mlp", generator=g)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    dead = series(load(tmp_path), "dead_fraction/act")
    assert dead and max(dead.values()) == 1.0


def test_each_window_is_on_disk_within_the_flush_bound_without_a_thread_of_our_own(
    tmp_path: Path,
) -> None:
    """SummaryWriter's own queue writes the events; the sink starts no thread and never waits
    for the disk, yet a flushed window is readable before detach within FLUSH_SECS (what a live
    tensorboard, a crash or kill -9 sees), and Sentinel.flush() puts it there at once."""
    before = set(threading.enumerate())
    loop = Loop(steps=5)
    sentinel = torch_sentinel.attach(loop.model, loop.opt, log_dir=str(tmp_path), flush_every=2)
    ours = [t for t in set(threading.enumerate()) - before if t.name.startswith("torch_sentinel")]
    assert ours == []
    loop.run()  # windows of steps 0-1 and 2-3 reach the sink; step 4 waits for the next one
    handed = time.monotonic()
    steps = logged_steps(tmp_path)
    while steps != [0, 1, 2, 3] and time.monotonic() - handed < TensorBoardSink.FLUSH_SECS + 10:
        time.sleep(0.05)
        steps = logged_steps(tmp_path)
    waited = time.monotonic() - handed
    assert steps == [0, 1, 2, 3]  # before detach; nothing on the training thread flushed
    assert waited <= TensorBoardSink.FLUSH_SECS + 1.0, waited  # slack: scheduling on a busy host
    sentinel.flush()
    assert logged_steps(tmp_path) == [0, 1, 2, 3, 4]  # at once, not FLUSH_SECS later
    sentinel.detach()
    assert series(load(tmp_path), "loss/train") == pytest.approx(dict(enumerate(loop.losses)))
