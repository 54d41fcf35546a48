"""The healthy corpora stay quiet with every format watched: ``examples/healthy/`` and the
healthy runs of ``tests/realworld/`` (which attach with their own options: ``attach`` is
wrapped to add ``precision=``). With the defaults they run in the corpus tests themselves."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from helpers import EXAMPLES, load_program
from realworld.harness import execute, load, program_names

import torch_sentinel
from torch_sentinel.integrations import lightning as lightning_integration

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ALL = ("bf16", "fp16", "e4m3", "e5m2")
HEALTHY = sorted((EXAMPLES / "healthy").glob("*.py"))


@pytest.fixture
def every_format(monkeypatch: pytest.MonkeyPatch) -> None:
    attach = torch_sentinel.attach

    def watching(*args: Any, **kwargs: Any) -> torch_sentinel.Sentinel:
        return attach(*args, **{**kwargs, "precision": ALL})

    monkeypatch.setattr(torch_sentinel, "attach", watching)
    monkeypatch.setattr(lightning_integration, "attach", watching)  # the callback's own import


@pytest.mark.usefixtures("every_format")
@pytest.mark.parametrize("path", HEALTHY, ids=[p.stem for p in HEALTHY])
def test_healthy_examples_are_quiet(path: pathlib.Path) -> None:
    report = load_program(path, "healthy").run()
    assert [str(f) for f in report.findings if f.kind.startswith("precision")] == []


@pytest.mark.usefixtures("every_format")
@pytest.mark.parametrize("name", program_names(), ids=program_names())
def test_realworld_healthy_runs_are_quiet(name: str, tmp_path: pathlib.Path) -> None:
    if load(name).HEALTHY_XFAIL:
        pytest.skip("not healthy in the corpus either")
    outcome = execute(load(name), None, tmp_path)
    assert outcome.error is None
    assert [str(f) for f in outcome.findings if f.kind.startswith("precision")] == []
    assert (tmp_path / "precision.jsonl").exists()


def test_the_fp16_example_needs_its_grad_scaler() -> None:
    """Without the scaler, the same program's hidden-layer gradients underflow: the quiet above
    is the scaler's doing, not blindness."""
    path = EXAMPLES / "healthy" / "fp16_autocast_grad_scaler.py"
    source = path.read_text().replace('GradScaler("cpu")', 'GradScaler("cpu", enabled=False)')
    namespace: dict[str, Any] = {"__name__": "fp16_without_scaler"}
    exec(compile(source, str(path), "exec"), namespace)
    report = namespace["run"]()
    assert {f.module for f in report.by_kind("precision_underflow")} == {"0", "2"}
