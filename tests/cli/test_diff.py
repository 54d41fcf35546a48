"""torch-sentinel diff: names the changed factors, warns when more than one changed, compares losses."""

from __future__ import annotations

import pytest
import torch
from helpers import MLP, train

import torch_sentinel
from torch_sentinel.cli import main


def _run(log_dir: str, seed: int, lr: float) -> list[float]:
    torch_sentinel.seed_everything(seed, warn=False)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    with torch_sentinel.attach(model, opt, log_dir=log_dir, seed=seed):
        return train(model, opt, "mlp", steps=3)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name, seed, lr in [("base", 1, 0.1), ("same", 1, 0.1), ("lr", 1, 0.05), ("both", 2, 0.05)]:
        out[name] = str(root / name)
        _run(out[name], seed, lr)
    return out


def test_same_seed_same_config_gives_identical_final_loss(runs: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", runs["base"], runs["same"]]) == 0
    out = capsys.readouterr().out
    assert "no recorded factor differs" in out
    assert "final loss:" in out and ": identical" in out


def test_one_change_is_named_without_a_warning(runs: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", runs["base"], runs["lr"]]) == 0
    out = capsys.readouterr().out
    assert "optimizers.0.param_groups.0.lr  0.1  ->  0.05" in out
    assert "changed factors (1): optimizer.lr" in out
    assert "warning" not in out
    assert "B - A = " in out


def test_two_changes_warn_one_change_at_a_time(runs: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    main(["diff", runs["base"], runs["both"]])
    out = capsys.readouterr().out
    assert "changed factors (2): optimizer.lr, seed" in out
    assert "warning: 2 factors changed at once. Change one thing at a time" in out


def test_missing_run_is_a_clear_error(tmp_path, runs: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", runs["base"], str(tmp_path / "nope")]) == 2
    assert "no manifest.json" in capsys.readouterr().err
