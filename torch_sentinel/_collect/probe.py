"""The probe protocol: how anything that records device evidence plugs into the collector.

A *probe* is one small object that owns some slots of the step's ledger row and fills them from
the events the collector delivers. The collector (``collector.py``) is only a scheduler: it owns
the hooks and patches where events come from, and calls, in registration order, the probes that
override the matching ``on_*`` method (a method left as the base no-op costs nothing: it is not
called). Built-in probes live in ``_collect/probes/``; a detector that needs device evidence
either is a probe itself (see ``detectors/eval_mode_training.py``) or returns the probes it
reads from :meth:`~torch_sentinel.detectors.base.Detector.probes`.

Lifecycle of a probe, in order:

1. :meth:`Probe.setup` once, at ``attach()``: reserve ledger blocks
   (``host.ledger.add_block(name, keys)`` / ``add_minmax_block``), subscribe process-wide
   patches through ``host.hooks.subscribe`` (removed at detach), remember what you need.
2. :meth:`Probe.output_modules`: which modules' outputs :meth:`Probe.on_output` receives.
3. The events, on the training thread, inside hooks (hot path: record tensors with
   ``host.reduce_later`` / ``host.fraction_later`` or launch device ops into your slots, never
   read a device value; see the sync-audit rules in ``collector.py``). Recorded tensors are the
   collector's to reduce at its boundaries and to drop when the step is abandoned or the
   forward raises: a probe keeps no boundary logic of its own (a probe that batches work of
   its own kind hands the batch to ``host.flush_at_boundaries`` in ``setup``, and the
   collector flushes and drops it at the same points):

   ==========================  ===========================================================
   ``on_root_inputs``           the attached model's forward is called (raw args, kwargs)
   ``on_data``                  each floating tensor of that call (``main``: the batch)
   ``on_output``                each floating tensor output by a module you asked for
   ``on_output_grad``           the gradient arriving at a watched module output
   ``on_backward``              a ``backward()`` on a scalar loss of the model (unscaled)
   ``on_cleared``               the gradients were cleared after this step's first backward
   ``on_pre_step``              an optimizer's step is about to update (gradients final)
   ``on_post_step``             an optimizer's step finished
   ``on_row_close``             the step's row is complete, just before it is queued
   ``on_row_closed``            after the row was queued and landed rows handed on
   ==========================  ===========================================================

4. What the probe learned reaches readers as typed facts (``_record/fact.py``), declared in
   :attr:`Probe.publishes` and defined next to the probe: host facts are published during
   the step (``host.publish(fact)``), device facts are decoded from the landed row by a
   decoder the probe registers in ``setup`` (``host.provide(FactType, decode)``). Detectors
   and sinks read them with ``record.fact(FactType)``; nothing reads a probe's attributes.
   Larger device state (masks over a window) is fetched with ``transfer.AsyncFetch`` and
   published as a fact on the step where it landed.
5. :meth:`Probe.close` at ``detach()``: drop device references.

Rules: never ``.item()``/``bool()``/``float()`` a tensor in an ``on_*`` method; write with
``out=`` ops into ``host.ledger.views[i]``; keep host facts plain Python. An exception from a
probe is a sentinel bug: it is logged once and the probe is switched off; training goes on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Optional, Protocol

import torch
from torch import nn

from .._record import Fact, FactSources

if TYPE_CHECKING:
    from .._record import StepMeta, StepRecord
    from .._record.fault import Fault
    from .boundaries import Pending
    from .hookset import HookSet
    from .ledger import Ledger
    from .model_map import ModelMap

__all__ = ["EVENTS", "Probe", "ProbeHost", "overrides"]

#: The event methods, in the order a training step delivers them.
EVENTS = (
    "on_root_inputs",
    "on_data",
    "on_output",
    "on_output_grad",
    "on_backward",
    "on_cleared",
    "on_pre_step",
    "on_post_step",
    "on_row_close",
    "on_row_closed",
)


class ProbeHost(Protocol):
    """What a probe may use of the collector (all public, read-mostly)."""

    #: The step's row of device slots (reserve blocks here in ``setup``).
    ledger: Ledger
    #: Module and parameter names of the attached model.
    map: ModelMap
    #: (name, tensor) of every trainable tensor watched: model parameters, then optimizer-only ones.
    params: list[tuple[str, torch.Tensor]]
    param_tensors: list[torch.Tensor]
    optimizers: list[torch.optim.Optimizer]
    module_names: list[str]
    device: torch.device
    #: Removable hooks and patch subscriptions; everything added here is undone at detach.
    hooks: HookSet
    #: The decoders of this sentinel's device facts (``provide`` registers one).
    facts: FactSources
    #: Whether probes check their own slots on the spot (CPU) instead of at flush.
    immediate: bool
    #: Set once a hook was traced by torch.compile: host checks in hooks never run then.
    traced: bool
    #: Whether some parameter is sharded (DTensor / FSDP2): graph leaves are not the params.
    sharded: bool

    @property
    def meta(self) -> StepMeta:
        """Host facts of the step in progress."""
        ...

    @property
    def step(self) -> int:
        """The number of the step in progress (0-based, or the framework's numbering)."""
        ...

    @property
    def stepped_optimizers(self) -> set[int]:
        """Optimizers (by id) that already stepped in the row in progress."""
        ...

    @property
    def rerunning(self) -> bool:
        """Inside :meth:`rerun_forward`."""
        ...

    def on_fault(self, fault: Fault) -> None:
        """Report a :class:`~torch_sentinel._record.fault.Fault` found in immediate mode."""
        ...

    @property
    def fully_watched(self) -> bool:
        """Whether every module is hooked on the step in progress (``watching.py``)."""
        ...

    def forward_order(self) -> list[int]:
        """Module slots in the order they first completed a forward pass."""
        ...

    def publish(self, fact: Fact) -> None:
        """Attach a host fact to the step in progress (one per type: a later one replaces it)."""
        ...

    def mark_in_row(self, kind: type[Fact]) -> None:
        """Note that this step's row holds values of the device fact ``kind``."""
        ...

    def provide(self, kind: type[Fact], decode: Callable[[StepRecord], Optional[Fact]]) -> None:
        """Make ``kind`` readable from every landed record, decoded from the row by ``decode``."""
        ...

    def add_probe(self, probe: Probe) -> None:
        """Set ``probe`` up and schedule the events it implements (once)."""
        ...

    def has_probe(self, kind: type[Probe]) -> bool:
        """Whether a probe of class ``kind`` is set up already."""
        ...

    def threshold(self, key: str, default: float) -> float:
        """The ``attach(thresholds=...)`` value of ``key`` (``"<kind>.<name>"``), else ``default``:
        for a probe that serves one detector's kind and is tuned by its thresholds."""
        ...

    def reduce_into(self, t: torch.Tensor, lo: int, hi: int, compiling: bool = False, probe: str = "") -> None:
        """Fold ``t``'s min and max into the slot pair ``(lo, hi)``, on the device, in the
        row's dtype (float64 once a float64 tensor came by); a dtype torch cannot reduce is
        skipped with one warning naming ``probe``."""
        ...

    def flush_at_boundaries(self, pending: Pending) -> None:
        """Have ``pending`` (a probe's own batch of recorded work) flushed at each boundary
        where :meth:`reduce_later`'s tensors are reduced, and dropped where they are (eager
        steps; a probe reduces on the spot while compiling)."""
        ...

    def reduce_later(self, t: torch.Tensor, lo: int, hi: int, probe: str,
                     on_bad: Optional[Callable[[torch.Tensor], None]] = None) -> None:
        """Record ``t`` for the slot pair ``(lo, hi)``: at the next boundary (end of the forward,
        of backward, before the update) every pending tensor is reduced at once and the pair
        gets ``(-|t|max, |t|max)``. In immediate mode ``on_bad(t)`` is called then if ``t`` is
        non-finite, in recording order (the first bad tensor first). Eager steps only: under
        torch.compile use :meth:`reduce_into`, which traces."""
        ...

    def fraction_later(self, t: torch.Tensor, slot: int, shift: float, edge: float) -> None:
        """Record ``t`` for ``slot``: at the next boundary, as for :meth:`reduce_later`, the slot
        gets the fraction of ``t``'s values ``v`` with ``|v - shift| > edge`` (batched per group
        of same-sized tensors; a slot recorded twice keeps the later tensor). Eager steps only."""
        ...

    def forward_rng(self) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The torch RNG state (CPU generator, the model device's) at the entry of the root
        call in progress, captured once per call and shared; ask from the root's entry only
        (``on_root_inputs``, or a root forward pre-hook registered after attach)."""
        ...

    def rerun_forward(self) -> str:
        """Run the step's forward again with every module watched, to localise a fault the
        modules watched on this step only detected (immediate mode, cold path): ``"localised"``
        (reported through ``on_fault``, which usually raises), ``"root"`` (only the model's own
        output was non-finite), ``"clean"`` (not reproduced) or ``"failed"``."""
        ...

    def host_value(self, i: int) -> float:
        """Slot ``i`` now (immediate mode only: a memory load on CPU, a device read elsewhere)."""
        ...

    def finite(self, i: int) -> bool:
        """Whether slot ``i`` is finite now (immediate mode only, like :meth:`host_value`)."""
        ...


class Probe:
    """Base class: every event is a no-op until overridden. Subclass and override what you need.

    A probe that :attr:`publishes` facts is set up by the sentinel whenever a detector or sink
    reads one of them (once, shared by every reader), so it must be constructible without
    arguments.
    """

    #: Shown in the one warning logged if this probe raises.
    name: str = ""
    #: The fact types this probe publishes (its readers find it through them).
    publishes: ClassVar[tuple[type[Fact], ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for fact in cls.__dict__.get("publishes", ()):
            if fact.producer is not None and fact.producer is not cls:
                raise TypeError(f"{fact.__name__} is already published by {fact.producer.__name__}")
            fact.producer = cls

    #: Attributes that belong to the live run (set up at attach): never in a checkpoint. A
    #: detector saves the rest of a probe it holds (see ``detectors/state.py``).
    live_attributes: ClassVar[frozenset[str]] = frozenset({"host"})

    def setup(self, host: ProbeHost) -> None:
        """Reserve ledger blocks and subscribe patches. Called once at attach, before any event."""

    def output_modules(self, host: ProbeHost) -> Iterable[nn.Module]:
        """The modules whose outputs :meth:`on_output` receives (default: none)."""
        return ()

    def due(self, step: int) -> bool:
        """Whether :meth:`on_output` needs the outputs of step ``step``. In immediate mode the
        collector hooks a module on a step only if one of its probes is due (``watching.py``);
        default: every step."""
        return True

    def on_root_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The attached model was called in a training forward (grad enabled). Host refs only."""

    def on_data(self, t: torch.Tensor, main: bool, name: Optional[str], compiling: bool) -> None:
        """One floating tensor of the model's call; ``main`` marks the batch (first positional
        tensor, or first non-mask keyword tensor); ``name`` is its keyword, if any."""

    def on_output(self, slot: int, module: nn.Module, args: Any, t: torch.Tensor, compiling: bool) -> None:
        """One floating tensor output by ``module`` (``slot`` indexes ``host.module_names``).
        A tensor already delivered as the previous module's output (a container returning
        its child's output as is) is not delivered again, except while compiling."""

    def on_output_grad(self, slot: int, grad: torch.Tensor) -> None:
        """The gradient arriving at the output of module ``slot`` during backward."""

    def on_backward(self, loss: torch.Tensor) -> None:
        """``backward()`` was called on ``loss`` (a scalar of the model's graph; unscaled under AMP).
        ``host.meta.backward_calls`` counts the earlier backward calls of this step."""

    def on_cleared(self) -> None:
        """The model's gradients were cleared after the step's earlier backward calls, which no
        longer count (a GAN's generator loss reached the discriminator, whose ``zero_grad()``
        then threw those gradients away): what they measured is void."""

    def on_pre_step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer`` is about to update: gradients are final (after a closure, if any).
        Runs under ``torch.no_grad()``. ``optimizer`` is None when the sentinel was attached
        without one: each ``backward()`` is then a step, and this runs when it returns."""

    def on_post_step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()`` returned."""

    def on_row_close(self, meta: StepMeta) -> None:
        """The step's row is complete (every optimizer stepped, or the scaler skipped)."""

    def on_row_closed(self, step: int) -> None:
        """Step ``step``'s row was queued and landed rows were handed on: the point every rank
        reaches once per step (cross-rank decisions go here)."""

    def close(self) -> None:
        """Detach: drop device references."""


def overrides(probe: Probe, event: str) -> bool:
    """Whether ``probe`` implements ``event`` (so the collector schedules it)."""
    return getattr(type(probe), event, None) is not getattr(Probe, event)


def unique(probes: Sequence[Probe]) -> list[Probe]:
    """Probes in order, each once (a probe shared by several detectors is set up once)."""
    seen: set[int] = set()
    out = []
    for p in probes:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out
