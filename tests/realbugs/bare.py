"""Ground truth without the sentinel: run a program with ``attach()`` replaced by a stand-in and
print what training physically did, so a case's expectation can be checked against the bug and
not against what the sentinel says.

``PYTHONPATH=$PWD:$PWD/tests python tests/realbugs/bare.py [program-stem ...]``

For each program, buggy and fixed: the loss of every backward at a few steps, whether any loss
was non-finite, and the parameters that never changed over the run.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Optional

import torch
from realbugs.harness import PROGRAMS, load

import torch_sentinel


class _Report:
    findings: list[Any] = []


class _StandIn:
    """What a program uses of a Sentinel: a context manager with ``step``, ``findings``,
    ``report()``, ``observe_validation()`` and ``note()``; it records nothing but the start weights."""

    def __init__(self, model: torch.nn.Module, optimizer: Any = None, **_: Any) -> None:
        self.model = model
        self.step = 0
        self.findings: list[Any] = []
        self.start = {n: p.detach().clone() for n, p in model.named_parameters()}

    def __enter__(self) -> _StandIn:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def observe_validation(self, loss: Any) -> None:
        return None

    def observe_loss(self, loss: Any) -> None:
        return None

    def note(self, text: str) -> None:
        return None

    def report(self) -> _Report:
        return _Report()


def bare_run(program: Any, bug: bool) -> tuple[list[tuple[int, float]], list[str], int]:
    """(step, loss) of every backward, the parameters that never moved, and the steps run."""
    losses: list[tuple[int, float]] = []
    steps = [0]
    made: list[_StandIn] = []
    original_backward = torch.Tensor.backward

    def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self.numel() == 1:
            losses.append((steps[0], float(self.detach())))
        return original_backward(self, *args, **kwargs)

    def fake_attach(model: torch.nn.Module, optimizer: Any = None, **kw: Any) -> _StandIn:
        made.append(_StandIn(model, optimizer, **kw))
        return made[-1]

    def watch(s: _StandIn) -> None:
        steps[0] += 1
        s.step = steps[0]

    saved = torch_sentinel.attach
    torch_sentinel.attach = fake_attach  # type: ignore[assignment]
    torch.Tensor.backward = backward  # type: ignore[method-assign]
    try:
        program.run(bug, watch)
    finally:
        torch_sentinel.attach = saved
        torch.Tensor.backward = original_backward  # type: ignore[method-assign]
    still: list[str] = []
    for s in made:
        for n, p in s.model.named_parameters():
            if torch.equal(p.detach(), s.start[n]):
                still.append(n)
    return losses, still, steps[0]


def _fmt(losses: list[tuple[int, float]], steps: int) -> str:
    if not losses:
        return "no backward"
    marks = sorted({0, 5, 10, 20, 30, 40, 60, steps - 1})
    first: dict[int, float] = {}
    for k, v in losses:
        first.setdefault(k, v)
    shown = [f"{k}:{first[k]:.4g}" for k in marks if k in first]
    bad = next((k for k, v in losses if not math.isfinite(v)), None)
    return " ".join(shown) + (f"  first non-finite loss at step {bad}" if bad is not None else "")


def main(names: Optional[list[str]] = None) -> None:
    torch.set_num_threads(1)
    for path in PROGRAMS:
        if names and path.stem not in names:
            continue
        p = load(path)
        for bug in (True, False):
            try:
                losses, still, steps = bare_run(p, bug)
                line = f"{_fmt(losses, steps)}  still: {still[:6]}{'...' if len(still) > 6 else ''}"
            except Exception as exc:  # a raise is itself the ground truth to look at
                line = f"raised {type(exc).__name__}: {exc}"
            print(f"{path.stem:45s} {'bug  ' if bug else 'fixed'} {line}")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:] or None)
