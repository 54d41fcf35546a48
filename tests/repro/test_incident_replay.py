"""Incident bundles on a real fault, and their replay reproducing it at the same module."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import torch_sentinel
from torch_sentinel.repro.incident import capture_rng, restore_rng
from torch_sentinel.repro.replay import load_bundle


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class Sqrt(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x)


class LogNet(nn.Module):
    """Finite until a batch with a large negative feature reaches the log."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)
        self.log = Log()
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.log(self.drop(self.fc(x)).abs() + x[:, :1]))


class SqrtNet(nn.Module):
    """Forward finite; backward infinite where the sqrt's input is exactly 0."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.relu = nn.ReLU()
        self.sqrt = Sqrt()
        self.head = nn.Linear(4, 1)
        nn.init.constant_(self.fc.bias, 10.0)  # every unit alive until the fault

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.sqrt(self.relu(self.fc(x))))


def _fail(model: nn.Module, log_dir: str, bad_step: int, check: str = "immediate") -> tuple[torch_sentinel.NonFiniteError, dict]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen: dict = {}
    hook = model.drop.register_forward_hook(lambda m, a, o: seen.update(drop=o.norm().item())) if hasattr(model, "drop") else None
    g = torch.Generator().manual_seed(0)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, check=check):
        for step in range(bad_step + 3):
            x = torch.rand(8, 4, generator=g) + 1
            if step == bad_step:
                if isinstance(model, LogNet):
                    x[2, 0] = -100.0
                else:
                    with torch.no_grad():
                        model.fc.bias.fill_(-1e4)  # every unit dead: sqrt(0) in the backward
                seen["batch"] = x.clone()
                seen["params"] = {k: v.clone() for k, v in model.state_dict().items()}
            try:
                loss = model(x).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            except torch_sentinel.NonFiniteError as err:
                if hook is not None:
                    hook.remove()
                return err, seen
    raise AssertionError("the fault was not raised")


def test_bundle_holds_what_a_replay_needs(tmp_path) -> None:
    torch.manual_seed(0)
    err, seen = _fail(LogNet(), str(tmp_path), bad_step=3)
    assert (err.step, err.boundary, err.module) == (3, "forward", "log")
    path = tmp_path / "incidents" / "step_3.pt"
    assert path.exists()
    b = load_bundle(str(path))
    assert b["step"] == 3 and b["inputs_step"] == 3 and b["check_mode"] == "immediate"
    assert torch.equal(b["inputs"]["args"][0], seen["batch"])
    assert b["params_before_faulty_step"] is True
    assert all(torch.equal(b["params"][k], v) for k, v in seen["params"].items())
    assert set(b["rng"]) >= {"torch"}  # python's and numpy's are too costly to read every step
    assert [s["step"] for s in b["scalars"]] == [0, 1, 2]
    assert all(isinstance(s["loss"], float) for s in b["scalars"])
    assert b["error"]["boundary"] == "forward" and b["error"]["module"] == "log"
    assert b["error"]["nan"] == err.nan and "non-finite values first appeared" in b["error"]["message"]
    assert b["manifest"]["model"]["parameters"] == 25


def test_replay_reproduces_the_same_error_at_the_same_module(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    err, seen = _fail(LogNet(), str(tmp_path), bad_step=2)
    result = torch_sentinel.replay(str(tmp_path / "incidents" / "step_2.pt"), LogNet())
    assert result.reproduced
    assert result.error is not None and (result.error.boundary, result.error.module) == (err.boundary, err.module)
    assert result.error.nan == err.nan
    assert [r.module for r in result.rows] == ["fc", "drop", "log"]  # up to the first offender
    drop = result.rows[1]
    assert drop.output_norm == pytest.approx(seen["drop"], rel=1e-5)  # same dropout mask: RNG restored
    assert result.rows[-1].output_finite is False and result.rows[-1].input_finite is True
    out = capsys.readouterr().out
    assert "log     Log      ok" in out and "BAD nan" in out and "<- first offender" in out
    assert "reproduced: non-finite values first appeared" in out


def test_replay_of_a_gradient_fault_with_the_loss(tmp_path) -> None:
    torch.manual_seed(1)
    err, _ = _fail(SqrtNet(), str(tmp_path), bad_step=1)
    assert err.boundary == "gradients"
    result = torch_sentinel.replay(str(tmp_path / "incidents" / "step_1.pt"), SqrtNet(),
                                   loss_fn=lambda out: out.pow(2).mean(), verbose=False)
    assert result.reproduced and result.backward == "loss_fn(output)"
    assert (result.error.boundary, result.error.module) == ("gradients", err.module)
    by_name = {r.module: r for r in result.rows}
    assert by_name["sqrt"].output_finite is True and by_name["relu"].grad_finite is False


def test_deferred_mode_says_parameters_are_not_from_before_the_step(tmp_path) -> None:
    torch.manual_seed(0)
    _fail(LogNet(), str(tmp_path), bad_step=2, check="deferred")
    b = load_bundle(str(tmp_path / "incidents" / "step_2.pt"))
    assert b["params_before_faulty_step"] is False
    assert "after" in b["params_note"] and b["inputs_step"] == 2


def test_no_log_dir_no_bundle(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    model = LogNet()
    with torch_sentinel.attach(model, None), pytest.raises(torch_sentinel.NonFiniteError):
        model(torch.full((2, 4), -5.0))
    assert os.listdir(tmp_path) == []


def test_rng_round_trip() -> None:
    state = capture_rng()
    drawn = torch.rand(2)
    restore_rng(state)
    assert torch.equal(torch.rand(2), drawn)


def test_rng_capture_leaves_python_and_numpy_alone() -> None:
    """They are not read every step (0.1-0.5 ms); a bundle holds the torch states only."""
    import random

    import numpy as np
    state = capture_rng()
    assert set(state) <= {"torch", "cuda"}
    drawn = (random.random(), np.random.rand())
    restore_rng(state)
    assert (random.random(), np.random.rand()) != drawn  # not rewound


def test_replay_rejects_a_file_that_is_not_a_bundle(tmp_path) -> None:
    path = tmp_path / "x.pt"
    torch.save({"weights": torch.ones(1)}, path)
    with pytest.raises(torch_sentinel.SentinelError, match="not a torch_sentinel incident bundle"):
        torch_sentinel.replay(str(path), LogNet())


def test_note_reaches_the_report_with_its_step() -> None:
    model = LogNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torch_sentinel.attach(model, opt) as s:
        model(torch.rand(2, 4) + 1).sum().backward()
        opt.step()
        s.note(symptom="loss NaN at step 3", hypothesis="log of a negative feature",
               change="clamp the feature at 1e-6", evidence="forward boundary, module log")
        report = s.report()
    (entry,) = report.notes
    assert entry["step"] == 1 and entry["hypothesis"] == "log of a negative feature"
    assert "change=clamp the feature at 1e-6" in str(report)
