"""log_dir/manifest.json: the run's factors at attach, completed with final figures at detach."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from helpers import MLP, train

import torch_sentinel


def _git(cwd, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_manifest_records_the_run(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "train.py").write_text("print(1)\n")
    _git(repo, "add", "train.py")
    _git(repo, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "init")
    (repo / "train.py").write_text("print(2)\n")  # dirty
    monkeypatch.chdir(repo)
    model = MLP()
    opt = torch.optim.AdamW([
        {"params": model.fc1.parameters(), "lr": 1e-3, "name": "body"},
        {"params": list(model.fc2.parameters()) + list(model.head.parameters()), "lr": 1e-2},
    ], weight_decay=0.05)
    log_dir = tmp_path / "run"
    with torch_sentinel.attach(model, opt, log_dir=str(log_dir), seed=123):
        on_disk = json.loads((log_dir / "manifest.json").read_text())
        losses = train(model, opt, "mlp", steps=3)
    m = json.loads((log_dir / "manifest.json").read_text())
    assert on_disk["seed"] == m["seed"] == 123 and m["seed_source"] == "attach"
    assert m["versions"]["torch"] == torch.__version__ and m["versions"]["python"].count(".") == 2
    assert set(m["versions"]) >= {"numpy", "cuda", "cudnn"}
    assert m["devices"]["model"] == ["cpu"]
    assert m["determinism"]["deterministic_algorithms"] is False
    assert set(m["determinism"]) >= {"cudnn_benchmark", "cudnn_deterministic"}
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert m["git"]["commit"] == head and m["git"]["dirty"] is True
    assert m["command"][0].endswith(("python", "python3")) or "python" in m["command"][0]
    groups = m["optimizers"][0]["param_groups"]
    assert m["optimizers"][0]["type"] == "torch.optim.adamw.AdamW"
    assert [g["lr"] for g in groups] == [1e-3, 1e-2]
    assert groups[0]["name"] == "body" and groups[1]["weight_decay"] == 0.05
    assert m["model"]["parameters"] == sum(p.numel() for p in model.parameters())
    assert m["result"]["steps"] == 3
    assert m["result"]["final_loss"] == pytest.approx(losses[-1], rel=1e-6)


def test_seed_from_seed_everything_and_no_git_outside_a_repo(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    torch_sentinel.seed_everything(9, warn=False)
    model = MLP()
    with torch_sentinel.attach(model, torch.optim.SGD(model.parameters(), lr=0.1), log_dir=str(tmp_path / "r")) as s:
        assert s.manifest["seed"] == 9 and s.manifest["seed_source"] == "seed_everything"
    m = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert m["git"] is None


def test_no_log_dir_writes_nothing_but_fills_the_manifest(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    model = MLP()
    with torch_sentinel.attach(model, None, seed=1) as s:
        assert s.manifest["seed"] == 1 and s.manifest["git"] is None
        assert s.manifest["model"]["parameters"] > 0
    assert list(tmp_path.iterdir()) == []
