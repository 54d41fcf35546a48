"""What every detector shares: the run context it reads and the protocol it implements.

A detector is host code. Its verdicts read :class:`StepRecord`s (plain numbers copied from the
device) and the static :class:`RunContext`, keep whatever small state they need across windows,
and return :class:`Finding`s. The device evidence it reads comes from probes
(``torch_sentinel._collect.probe.Probe``), declared by :meth:`Detector.probes`: either shared
ones from ``_collect`` (``InputStats``, ``LossInputs``, ...) or the detector itself, when it
subclasses ``Probe`` too (see ``eval_mode_training.py``: one file, events and verdict).

Writing a detector: subclass :class:`Detector`, set ``kind`` and ``boundary``, implement
``observe`` (and ``finish`` for whole-run verdicts), return its probes from ``probes``, and add
the class to ``registry.DETECTORS``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Optional

from .._collect.probe import Probe
from .._collect.records import StepRecord
from .._findings import Boundary, Finding
from .state import host_state, restore_state

if TYPE_CHECKING:
    from ..precision.monitor import PrecisionMonitor

__all__ = ["Detector", "RunContext"]


@dataclasses.dataclass
class RunContext:
    """Static facts about the attached run, shared by all detectors."""

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
    #: Detectors may stash device-side state here (accumulators) through the collector taps.
    extras: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: The low-precision headroom rows (``attach(precision=...)``), read by the precision_*
    #: detectors; None when no format is watched.
    precision: Optional[PrecisionMonitor] = None

    def threshold(self, key: str, default: float) -> float:
        return float(self.thresholds.get(key, default))

    def owner(self, param: str) -> Optional[str]:
        return self.param_owner.get(param)


class Detector:
    """One finding kind (or a tight family of them), interpreted on the host.

    ``observe`` is called once per flush with the records of the window, oldest first;
    ``finish`` once at ``report()`` (or detach) for verdicts that need the whole run.
    """

    kind: ClassVar[str] = ""
    boundary: ClassVar[Boundary] = "data"

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def probes(self) -> Sequence[Probe]:
        """The probes whose slots and events this detector reads; set up once each at attach."""
        if isinstance(self, Probe):
            return (self,)
        return ()

    def at_attach(self) -> Iterable[Finding]:
        """Findings that are known once the probes are set up (static facts of the model)."""
        return ()

    def observe(self, records: Sequence[StepRecord]) -> Iterable[Finding]:
        return ()

    def statistics(self) -> dict[str, float]:
        """Scalars logged as ``detector/<kind>/<name>`` at each flush (default: none)."""
        return {}

    def finish(self) -> Iterable[Finding]:
        return ()

    def state_dict(self) -> dict[str, Any]:
        """The host state carried across a checkpoint (windows, counters, verdicts given).
        Default: every attribute that is plain host data; see ``detectors/state.py``."""
        return host_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        restore_state(self, state)

    def finding(self, message: str, **fields: Any) -> Finding:
        fields.setdefault("rank", self.ctx.rank)
        return Finding(kind=self.kind, boundary=self.boundary, message=message, **fields)
