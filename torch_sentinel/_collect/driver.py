"""What the event sources need of the collector: the :class:`Driver` protocol.

The collector (``collector.py``) is a small driver: it owns the step in progress, the probe
table, the ledger and the rows, and hands hook events to three event sources, one per part of
a training step: the forward (``events_forward.py``), the backward (``events_backward.py``) and
the optimizer step (``events_optimizer.py``). Each source holds the driver as this protocol, so
none of them imports the collector, and a reader sees in one place everything they share.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional, Protocol

if TYPE_CHECKING:
    import torch

    from .._record import StepMeta
    from .._record.fault import Fault
    from .amp import AmpTracker
    from .cleared import ClearedGrads
    from .closures import ClosureSteps
    from .entry import DataEntry
    from .hookset import HookSet
    from .loss_tally import LossTally
    from .model_map import ModelMap
    from .open_step import OpenStep
    from .replaced import Replacements
    from .schedule import ProbeTable
    from .scope import BackwardScope, OptimizerReach
    from .stepping import BackwardSteps
    from .unwatched import Unwatched
    from .watching import GradientWatch, ModuleWatch

__all__ = ["Driver"]


class Driver(Protocol):
    """The collector, as its event sources see it."""

    map: ModelMap
    module_names: list[str]
    device: torch.device
    optimizers: list[torch.optim.Optimizer]
    hooks: HookSet
    table: ProbeTable
    #: The step in progress (replaced whole when it closes).
    open: OpenStep
    #: Set at detach: no event is delivered any more.
    disabled: bool
    #: Set once a hook was traced by torch.compile: host checks in hooks never run then.
    traced: bool
    entry: DataEntry
    watch: ModuleWatch
    gradients: GradientWatch
    scope: BackwardScope
    reach: OptimizerReach
    cleared: ClearedGrads
    closures: ClosureSteps
    replacements: Replacements
    backward_steps: BackwardSteps
    loss: LossTally
    amp: AmpTracker
    unwatched: Unwatched

    @property
    def step(self) -> int: ...

    @property
    def meta(self) -> StepMeta: ...

    @property
    def immediate(self) -> bool: ...

    def on_fault(self, fault: Fault) -> None: ...

    def flush_pending(self) -> None: ...

    def drop_pending(self) -> None: ...

    def drain_landed(self) -> None: ...

    def close_row(self) -> None: ...

    def emit(self, event: str, *args: object) -> None:
        """Deliver ``event`` (an ``on_*`` name other than ``on_output``) to its subscribers."""
        ...

    def forward_check(self) -> Optional[Callable[..., None]]:
        """The forward probe's ``on_output``, which alone runs during a rerun of the forward."""
        ...
