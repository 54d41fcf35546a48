"""torch-sentinel replay: a bundle and a model factory in, the evidence table out."""

from __future__ import annotations

import textwrap

import pytest
import torch

import torch_sentinel
from torch_sentinel.cli import main

MODEL_FILE = textwrap.dedent('''
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.head = nn.Linear(4, 1)

        def forward(self, x):
            return self.head(torch.log(self.fc(x).abs() + x[:, :1]))

    def make():
        return Net()

    def loss(out):
        return out.pow(2).mean()
''')


@pytest.fixture
def incident(tmp_path) -> tuple[str, str]:
    path = tmp_path / "user_model.py"
    path.write_text(MODEL_FILE)
    from torch_sentinel.cli.replay import load_object

    model = load_object(f"{path}:make")()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torch_sentinel.attach(model, opt, log_dir=str(tmp_path / "run")):
        for step in range(3):
            x = torch.rand(4, 4) + 1
            if step == 1:
                x[0, 0] = -50.0
            try:
                model(x).pow(2).mean().backward()
            except torch_sentinel.NonFiniteError:
                break
            opt.step()
    return str(tmp_path / "run" / "incidents" / "step_1.pt"), str(path)


def test_replay_prints_the_table_and_exits_1_when_reproduced(incident: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    bundle, model_file = incident
    code = main(["replay", bundle, "--model", f"{model_file}:make", "--loss", f"{model_file}:loss"])
    out = capsys.readouterr().out
    assert code == 1
    assert "replay of step 1 (original: boundary 'forward', module ''" in out
    assert "<- first offender" in out and "reproduced:" in out


def test_replay_cli_errors_are_clear(incident: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    bundle, model_file = incident
    assert main(["replay", bundle, "--model", "no_colon_here"]) == 2
    assert "expected 'module:callable'" in capsys.readouterr().err
    assert main(["replay", bundle + ".missing", "--model", f"{model_file}:make"]) == 2
