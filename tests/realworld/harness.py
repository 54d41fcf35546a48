"""Shared driver for the real-world corpus: run one program variant, read back what was found.

Each program in ``tests/realworld/programs/`` is a small training script modelled on public
training code. It defines:

- ``MODELLED_ON``: the public program it imitates (repository and path);
- ``BUGS``: ``{name: Bug(...)}``, the one-line bugs it can inject, with what should be found;
- ``HEALTHY_XFAIL``: None, or why the healthy run is known to get a false alarm today;
- ``ADVERSARIAL`` (optional): True for programs whose losses oscillate by design (GANs): the
  healthy run must be quiet; the "learns" check is skipped;
- ``run(bug, log_dir) -> list[float]``: trains (calling ``torch_sentinel.attach`` as a user
  would, with ``log_dir``) and returns the training losses it printed/logged itself.

The harness reads the findings back from ``findings.jsonl`` in ``log_dir`` (the file a user
would read), so what is checked is what the user gets.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import pathlib
import warnings
from types import ModuleType
from typing import Optional, Union

import torch_sentinel
from torch_sentinel import Finding, NonFiniteError

PROGRAMS_DIR = pathlib.Path(__file__).parent / "programs"
#: issue 12: "a fault present from its onset is reported within 20 optimizer steps of it"
MAX_LATENCY = 20


@dataclasses.dataclass(frozen=True)
class Bug:
    """One injected bug and what the sentinel should say about it.

    Args:
        line: the one-line change, in words (for the detection table).
        kind: the finding kind that names the cause, or a tuple of kinds that each name it (an
            oversized learning rate is named by ``update_ratio`` as well as by ``diverging``).
        module: the module the finding must name, or a module inside it (``""`` is the attached
            model itself and must be named exactly), or None when the bug has no place (a
            loop-level bug: zero_grad, lr, schedule).
        nonfinite: the run ends in ``NonFiniteError``.
        xfail: why the current detectors miss it (the test is strict-xfail), or None.
        onset: the first optimizer step (0-based) at which the fault is present, known by
            construction (a schedule reaching 0, an ``eval()`` left on after a mid-run pass).
        late: why the finding comes more than ``MAX_LATENCY`` steps after ``onset`` today (the
            latency test is strict-xfail), or None.
    """

    line: str
    kind: Union[str, tuple[str, ...]]
    module: Optional[str] = None
    nonfinite: bool = False
    xfail: Optional[str] = None
    onset: int = 0
    late: Optional[str] = None


    @property
    def kinds(self) -> tuple[str, ...]:
        return (self.kind,) if isinstance(self.kind, str) else self.kind


@dataclasses.dataclass
class Outcome:
    """What one run produced: its losses, the findings read back, and the error if one escaped."""

    losses: list[float]
    findings: list[Finding]
    error: Optional[BaseException]

    @property
    def faults(self) -> list[Finding]:
        return [f for f in self.findings if f.is_fault]

    def first(self, kinds: tuple[str, ...]) -> Optional[Finding]:
        """The earliest finding of one of ``kinds`` (an escaped NonFiniteError counts as one)."""
        hits = [f for f in self.findings if f.kind in kinds]
        if isinstance(self.error, NonFiniteError) and "non_finite" in kinds and not any(
                f.kind == "non_finite" for f in hits):
            hits.append(Finding(kind="non_finite", boundary=self.error.boundary,  # type: ignore[arg-type]
                                message=str(self.error), module=self.error.module,
                                step=self.error.step, severity="error"))
        return min(hits, key=lambda f: (f.step if f.step is not None else 1 << 30)) if hits else None

    @staticmethod
    def localised(found: Optional[str], expected: str) -> bool:
        """``found`` names ``expected`` or a module inside it (the root ``""`` only exactly)."""
        if found is None:
            return False
        return found == expected or (expected != "" and found.startswith(expected + "."))

    def summary(self) -> list[tuple[str, Optional[str], Optional[int]]]:
        return [(f.kind, f.module, f.step) for f in self.findings]


def program_names() -> list[str]:
    return sorted(p.stem for p in PROGRAMS_DIR.glob("*.py") if not p.stem.startswith("_"))


def load(name: str) -> ModuleType:
    return importlib.import_module(f"realworld.programs.{name}")


def read_findings(log_dir: pathlib.Path) -> list[Finding]:
    path = log_dir / "findings.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            data = json.loads(line)
            if data.get("kind") != "note":
                out.append(Finding.from_dict(data))
    return out


def execute(program: ModuleType, bug: Optional[str], log_dir: pathlib.Path) -> Outcome:
    """Run one variant in-process; a NonFiniteError (or any error) is captured, not raised."""
    losses: list[float] = []
    error: Optional[BaseException] = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.CRITICAL)
        try:
            losses = program.run(bug, str(log_dir))
        except NonFiniteError as exc:
            error = exc
        except Exception as exc:  # recorded: a healthy run must not raise, and the test says so
            error = exc
        finally:
            logging.disable(logging.NOTSET)
    return Outcome(losses, read_findings(log_dir), error)


__all__ = ["MAX_LATENCY", "Bug", "Outcome", "execute", "load", "program_names", "read_findings",
           "torch_sentinel"]
