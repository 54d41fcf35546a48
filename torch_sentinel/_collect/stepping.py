"""Step numbering: what number the next step gets, and what closes a step without an optimizer.

With optimizers, a step's row closes in the last optimizer's step hook (``collector.py``). Two
things are decided here instead:

- :class:`StepNumbering`: the next step's number. By default the count goes up by one; a
  training framework may number steps itself (Lightning's ``global_step``, HF's
  ``state.global_step``, counted from 1), and the sentinel then follows it. Numbers only increase.
- :class:`BackwardSteps`: without an optimizer, each ``backward()`` that reached the model is a
  step. Hand-written updates (``p -= lr * p.grad``) happen outside any hook, so the gradients
  are read when the backward returns, where they are final, and the row closes there.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol

import torch

from .probe import Probe
from .schedule import ProbeTable

__all__ = ["BackwardSteps", "StepHost", "StepNumbering"]


class StepNumbering:
    """The number of the step after the one in progress."""

    def __init__(self) -> None:
        #: The framework's counter: called when a row closes, it gives the next step's number.
        self.source: Optional[Callable[[], int]] = None

    def following(self, step: int) -> int:
        """The step after ``step``: ``step + 1``, or the framework's number if that is larger."""
        following = step + 1
        source = self.source
        if source is None:
            return following
        try:
            framework = int(source())
        except Exception:  # a framework's counter must never stop training
            return following
        return max(framework, following)


class StepHost(Protocol):
    """What :class:`BackwardSteps` needs of the collector."""

    disabled: bool
    optimizers: list[torch.optim.Optimizer]

    def close_row(self) -> None:
        ...


class BackwardSteps:
    """Without an optimizer, each counted ``backward()`` through the model closes a step.

    Args:
        host: the collector.
        table: the probe table; its ``on_pre_step`` subscribers read the final gradients.
        skip: a probe whose ``on_pre_step`` is left out (the update probe: there is no
            optimizer whose update it could measure).
    """

    def __init__(self, host: StepHost, table: ProbeTable, skip: Probe) -> None:
        self._host = host
        self._subs = table.subs["on_pre_step"]
        self._emit = table.emit
        self._skip = skip
        #: A backward reached the model since the last step closed.
        self.counted = False

    def count(self) -> None:
        """A backward on the model's loss reached it."""
        self.counted = True

    def finish(self) -> None:
        """The backward returned: without an optimizer, the step it counted is complete."""
        host = self._host
        if host.disabled or host.optimizers or not self.counted:
            return
        self.counted = False
        subs: list[Any] = [s for s in self._subs if getattr(s, "__self__", None) is not self._skip]
        with torch.no_grad():
            self._emit(subs, None)
        host.close_row()
