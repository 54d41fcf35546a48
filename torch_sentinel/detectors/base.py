"""The detector API: what a detector declares, what it implements, and the run it reads.

A detector turns step records into findings, on the host. It never sees a live tensor: the
device evidence it reads arrives as typed facts (``torch_sentinel.facts``) on each
:class:`~torch_sentinel.StepRecord`, and the probes that collect them are set up because the
detector declared them in :attr:`Detector.reads`.

Writing one (see the README's "Writing a detector" for a complete example):

.. code-block:: python

    class LossCeiling(Detector):
        kind = "loss_ceiling"                # the finding kind: stable, public
        rung = "curves"                      # where on the ladder its findings sit
        next_check = "inspect_data_and_targets"
        reads = (Loss,)                      # the facts it needs
        thresholds = {"max": Threshold(100.0, "the largest loss this task can reach")}

        def update(self, record):            # once per optimizer step, oldest first
            ...
        def conclude(self, final=False):     # at every flush, and once at the end
            return [self.finding("...", step=...)]

Pass instances to ``attach(..., detectors=[LossCeiling()])``. The built-in detectors use the
same API: each is one file in this package, found there by the sentinel (no registry to edit).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Callable, ClassVar, Optional

import torch

from .._collect.probe import Probe
from .._findings import Boundary, Finding
from .._record import Fact, StepMeta, StepRecord
from .state import host_state, restore_state

__all__ = ["Detector", "RunContext", "Threshold"]


@dataclasses.dataclass(frozen=True)
class Threshold:
    """A detector's tunable number: its default and where that default comes from (a paper, a
    tool, a measurement), so a reader can judge it. Override with
    ``attach(thresholds={"<kind>.<name>": value})``."""

    default: float
    source: str


@dataclasses.dataclass
class RunContext:
    """Static facts about the attached run, shared by every detector of a sentinel."""

    module_names: list[str]
    module_types: dict[str, str]
    param_names: list[str]
    param_owner: dict[str, str]
    #: Parameters held by some optimizer param group.
    optimizer_params: set[str]
    #: Module slots in forward execution order (learned during the first steps).
    forward_order: Callable[[], list[int]]
    thresholds: dict[str, float] = dataclasses.field(default_factory=dict)
    rank: Optional[int] = None
    #: True when a +inf norm in a row has been confirmed exactly (CPU rows); on accelerators in
    #: deferred mode a +inf norm without NaN may be float32 overflow of finite values.
    exact_norms: bool = True
    #: Whether a backward reached this model and another attached one (an adversarial loop,
    #: e.g. a GAN): its loss oscillates by design, so curve verdicts do not apply.
    adversarial: Callable[[], bool] = lambda: False
    #: The names of each optimizer's parameters, in optimizer order (several optimizers: a GAN
    #: over one container, or one network each).
    optimizer_groups: list[list[str]] = dataclasses.field(default_factory=list)
    #: Each optimizer's class name, in the same order.
    optimizer_types: list[str] = dataclasses.field(default_factory=list)
    #: Parameters that required grad at attach.
    trainable: set[str] = dataclasses.field(default_factory=set)
    #: Each watched parameter's dtype.
    param_dtypes: dict[str, torch.dtype] = dataclasses.field(default_factory=dict)
    #: The host facts of the step in progress (not yet closed): for verdicts at the end of a
    #: run whose last step never reached ``optimizer.step()``.
    in_progress: Callable[[], StepMeta] = lambda: StepMeta(step=0)

    def threshold(self, key: str, default: float) -> float:
        return float(self.thresholds.get(key, default))

    def owner(self, param: str) -> Optional[str]:
        return self.param_owner.get(param)


class Detector:
    """One finding kind (or a tight family of them), judged on the host.

    Declare on the class:

    - :attr:`kind`: the finding kind (stable public name; ``attach(disable={kind})`` turns it off);
    - :attr:`rung`: the ladder boundary its findings sit on (``"data"`` … ``"curves"``);
    - :attr:`next_check` and :attr:`hypothesis`: what its finding tells the user to check next,
      and the one-line hypothesis the report prints;
    - :attr:`reads`: the fact types it reads from records (their probes are set up for it);
    - :attr:`thresholds`: its tunable numbers, each a :class:`Threshold` with its source;
    - :attr:`explains`: the kinds whose evidence its fault accounts for (a cause and its
      symptoms: ``no_update`` explains ``plateau``), so the report leads with the cause.

    Implement :meth:`update` (once per step record, oldest first) and :meth:`conclude` (once at
    ``attach()``, for verdicts the run context alone supports; at each flush, every
    ``flush_every`` steps; and once more with ``final=True`` at ``report()`` or detach). A verdict that one step settles can be given from :meth:`update` with
    :meth:`flag`. A finding a detector gives twice (same kind, module and rung) is reported once.
    """

    kind: ClassVar[str] = ""
    rung: ClassVar[Boundary] = "curves"
    next_check: ClassVar[str] = ""
    hypothesis: ClassVar[str] = ""
    reads: ClassVar[tuple[type[Fact], ...]] = ()
    thresholds: ClassVar[Mapping[str, Threshold]] = {}
    #: Kinds whose evidence a fault of this kind accounts for, when both fire in one run: weights
    #: that never move (``no_update``) are why the loss does not fall (``plateau``). The report
    #: and the error lead with the explaining kind (``diagnosis/ladder.py``).
    explains: ClassVar[tuple[str, ...]] = ()
    #: Attributes that attach() rebuilds (the run context, references into the model, pending
    #: device copies): never in state_dict(). Every other attribute must be plain host data
    #: (see ``detectors/state.py``); list a subclass's own here, the base's are included.
    live_attributes: ClassVar[frozenset[str]] = frozenset({"ctx", "_flagged"})

    ctx: RunContext

    def bind(self, ctx: RunContext) -> None:
        """Called by the sentinel once, at ``attach()``, before any record: the run's static
        facts become ``self.ctx``, then :meth:`setup` runs."""
        self.ctx = ctx
        self.setup()

    def setup(self) -> None:
        """Prepare what depends on the run (``self.ctx``, thresholds). Default: nothing."""

    def probes(self) -> Sequence[Probe]:
        """Probes this detector owns and alone reads: device state kept over a window (a
        per-unit mask), which it fetches with the probe's own methods when it concludes. Set up
        once at ``attach()``; a probe of the class that publishes a fact in :attr:`reads`
        serves as that fact's producer too. Default: none."""
        return ()

    def update(self, record: StepRecord) -> None:
        """Take in one step record (host numbers and facts only)."""

    def conclude(self, final: bool = False) -> Iterable[Finding]:
        """The findings the evidence so far supports. ``final`` is set once, when the run ends
        (``report()`` or detach), for verdicts that need the whole run."""
        return ()

    def flag(self, finding: Finding) -> None:
        """Give ``finding`` from :meth:`update`: it reaches the report with the next flush."""
        self.__dict__.setdefault("_flagged", []).append(finding)

    def take_flagged(self) -> list[Finding]:
        """The findings :meth:`flag` gave since the last call (for the sentinel)."""
        return self.__dict__.pop("_flagged", [])

    def statistics(self) -> dict[str, float]:
        """Scalars logged as ``detector/<kind>/<name>`` at each flush (default: none)."""
        return {}

    def threshold(self, name: str) -> float:
        """``<kind>.<name>``: the value given to ``attach(thresholds=...)``, else the default
        declared in :attr:`thresholds` (declaring every name there is what lets ``attach()``
        reject a misspelt key)."""
        return self.ctx.threshold(f"{self.kind}.{name}", type(self).thresholds[name].default)

    def finding(self, message: str, **fields: Any) -> Finding:
        """A finding of this detector's kind and rung, with its next check and hypothesis unless
        ``fields`` says otherwise."""
        fields.setdefault("rank", self.ctx.rank)
        fields.setdefault("next_check", self.next_check or None)
        fields.setdefault("hypothesis", self.hypothesis or None)
        return Finding(kind=self.kind, boundary=self.rung, message=message, **fields)

    def state_dict(self) -> dict[str, Any]:
        """The host state carried across a checkpoint (windows, counters, verdicts given), as
        plain data. Default: every attribute not in ``live_attributes``; see ``detectors/state.py``."""
        return host_state(self)

    def load_state_dict(self, state: dict[str, Any], device: Optional[torch.device] = None) -> None:
        """Restore what :meth:`state_dict` saved; saved tensors go to ``device``."""
        restore_state(self, state, device)
