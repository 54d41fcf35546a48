"""What a sentinel holds of its model, owned by the model so that a kept sentinel never keeps it.

A user may keep the :class:`~torch_sentinel._api.Sentinel` long after the model is gone (in a
list of callbacks, a results dict, a notebook variable). Everything that refers to the model
(the collector with its module map and parameters, the probes, the detectors, the run context)
lives in one :class:`ModelSide`, which the sentinel references only weakly. The model owns it:
its hooks hold the collector, and the collector holds the ModelSide (``Collector.anchor``).

When the model is garbage-collected, the ModelSide goes with it, and on its way out closes the
sentinel quietly: pending rows are flushed, the detectors' end-of-run verdicts and the last
window reach the sinks, every hook and patch is removed. The sentinel then reads as detached:
``detach()`` is a no-op, ``report()`` returns the findings it had, ``step`` the last step.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
from torch import nn

from ._errors import SentinelError, format_message

if TYPE_CHECKING:
    from ._collect.collector import Collector
    from ._compile import HookLiveness
    from ._distributed import RankSync
    from ._lockstep import Lockstep
    from .detectors import RunContext
    from .detectors.base import Detector
    from .detectors.nonfinite import NonFiniteDiagnosis

__all__ = ["ModelSide", "ModelSideHandle"]


class ModelSide:
    """The model-side state of one sentinel (strong references to the model live only here).

    Args:
        model: the model as passed to ``attach()`` (maybe wrapped in DDP / compile).
        root: the model without its wrappers.
        optimizers: the unwrapped optimizers.
        collector: the sentinel's collector; it keeps this object alive (``anchor``).
        on_collected: called, with this object, when the model (and so this object) is being
            garbage-collected while the sentinel is still attached.
    """

    def __init__(self, model: nn.Module, root: nn.Module, optimizers: list[torch.optim.Optimizer],
                 collector: Collector, on_collected: Callable[[ModelSide], None]) -> None:
        self.model = model
        self.root = root
        self.optimizers = optimizers
        self.collector = collector
        self.context: Optional[RunContext] = None
        self.nonfinite: Optional[NonFiniteDiagnosis] = None
        self.detectors: list[Detector] = []
        self.lockstep: Optional[Lockstep] = None
        self.ranks: Optional[RankSync] = None
        self.liveness: Optional[HookLiveness] = None
        # Strong, like the collector's own callbacks (on_record, on_fault): when model and
        # sentinel are dropped together, weak references between them are already cleared by
        # the time either is finalized, and this is the one that closes the sentinel.
        self._on_collected: Optional[Callable[[ModelSide], None]] = on_collected
        collector.anchor = self

    def closed(self) -> None:
        """The sentinel was closed: nothing to do once the model is collected."""
        self._on_collected = None

    def __del__(self) -> None:
        callback, self._on_collected = self._on_collected, None
        if callback is not None:
            callback(self)


class ModelSideHandle:
    """What a :class:`~torch_sentinel._api.Sentinel` reads of its :class:`ModelSide`.

    The sentinel holds its model side weakly; while the model side closes the sentinel from its
    finalizer (the model is being collected), ``_pinned`` holds it, because weak references to
    an object being collected are already cleared then.
    """

    _model_name: str
    _detached: bool

    def _hold(self, side: ModelSide) -> None:
        self._side_ref: weakref.ref[ModelSide] = weakref.ref(side)
        self._pinned: Optional[ModelSide] = None

    def close_unattended(self) -> None:
        raise NotImplementedError

    def _live_side(self) -> Optional[ModelSide]:
        """The model-side state, or None once the model was garbage-collected."""
        return self._pinned if self._pinned is not None else self._side_ref()

    def _side(self) -> ModelSide:
        side = self._live_side()
        if side is None:
            raise SentinelError(format_message(
                f"the {self._model_name} this sentinel watched was garbage-collected",
                expected="the model alive while its sentinel is used",
                arrived=f"{self!r}: the model was dropped, and the sentinel closed itself",
                next_check="keep a reference to the model, or read sentinel.report() and findings only",
            ))
        return side

    @property
    def model(self) -> nn.Module:
        """The model as passed to ``attach()`` (a SentinelError once it was garbage-collected)."""
        return self._side().model

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The watched optimizers, unwrapped (empty once the model was garbage-collected)."""
        side = self._live_side()
        return side.optimizers if side is not None else []

    @property
    def context(self) -> RunContext:
        """What the detectors know of the model (names, owners, optimizer parameters)."""
        ctx = self._side().context
        assert ctx is not None
        return ctx

    @property
    def _collector(self) -> Collector:
        return self._side().collector

    @property
    def _detectors(self) -> list[Any]:
        side = self._live_side()
        return side.detectors if side is not None else []

    @property
    def _nonfinite(self) -> NonFiniteDiagnosis:
        diagnosis = self._side().nonfinite
        assert diagnosis is not None
        return diagnosis

    @property
    def _liveness(self) -> HookLiveness:
        liveness = self._side().liveness
        assert liveness is not None
        return liveness

    @property
    def _ranks(self) -> Optional[RankSync]:
        side = self._live_side()
        return side.ranks if side is not None else None

    @property
    def _lockstep(self) -> Optional[Lockstep]:
        side = self._live_side()
        return side.lockstep if side is not None else None

    def _on_model_collected(self, side: ModelSide) -> None:
        """The model is being garbage-collected while attached: close quietly (from a finalizer)."""
        self._pinned = side
        try:
            self.close_unattended()
        finally:
            self._pinned = None
