"""The probe: module outputs and parameter gradients into histograms, on sampled steps.

A thin adapter between the collector's events (``_collect/probe.py``) and
:func:`~torch_sentinel.precision.histogram.add_histogram`. It owns one int64 device buffer with
a row per watched tensor: the output of each module that computes (value-preserving modules
such as activations and dropout are left out, as the forward probe leaves them out), and the
gradients of each module's own parameters, together. On a sampled step (``cadence.sampled``):

- ``on_output``: the module's output goes into its activation row (a module called several
  times in the step, micro-batches, adds up);
- ``on_pre_step``: each parameter's gradient goes into its module's gradient row, times the
  GradScaler's scale when one scaled this step's loss, so the figures are those of the
  gradients backward computed;
- ``on_row_close``: the buffer is copied, without waiting, into a ring of host rows; the
  samples whose copy has landed (on CPU, this one) are turned into rows
  (:class:`~torch_sentinel.precision.monitor.PrecisionMonitor`) and published as the step's
  :class:`PrecisionRows` fact. On an accelerator a sample lands a step or so later and is
  published with the step it landed on; the last sampled step of a run whose training ends
  right after may not land before detach.

Steps 3-9 are sampled for the other probes but take no histogram here: only each tensor's
largest magnitude (``add_amax``), which extends the overflow trend and publishes no row (see
:func:`histogram_step`).

Ordinary steps launch nothing. Under ``torch.compile`` the output histograms are traced into
the graph, which then computes them on every step: the buffer is cleared after each step and
only sampled steps are copied.

Which formats are watched is settled once: the formats asked for (``attach(precision=...)``,
which constructs this probe), or by default the dtype the run computes in when it is bf16 or
fp16: the parameters' dtype (at attach), else autocast's dtype at the first training forward.
A float32 run watches nothing by default: from that first forward on the probe does nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Optional

import torch
from torch import nn

from .._collect.cadence import sampled
from .._collect.compat import sparse_values
from .._collect.probe import Probe, ProbeHost
from .._collect.shards import local
from .._collect.tensors import VALUE_PRESERVING, materialized, reducible
from .._collect.transfer import HostRing
from .._record import Fact, StepMeta
from .histogram import DeviceTables, Workspace, add_amax, add_histogram
from .layout import BinLayout
from .monitor import PrecisionMonitor, PrecisionRow, Sample, TensorRow

__all__ = ["PrecisionProbe", "PrecisionRows"]

_HALF = {torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclasses.dataclass(frozen=True)
class PrecisionRows(Fact):
    """The precision rows of the sampled steps whose histograms reached the host during this
    step (each row carries its own sampled step): every watched tensor in every watched format."""

    rows: tuple[PrecisionRow, ...]
    #: The formats watched.
    formats: tuple[str, ...]
    #: The format the run computes in ("bf16", "fp16"), or None for float32.
    compute_format: Optional[str]


class PrecisionProbe(Probe):
    """Histograms of module outputs and gradients on sampled steps.

    Args:
        formats: the formats asked for (canonical names, as ``attach(precision=...)``
            validated them), or None for the default (the dtype the run computes in, if bf16
            or fp16).
        ring_rows: sampled steps whose copies may be in flight to the host at once.
    """

    name = "precision"
    publishes = (PrecisionRows,)
    live_attributes: ClassVar[frozenset[str]] = frozenset(
        {"host", "tables", "buffer", "layout", "monitor", "_ring", "_workspace", "_outputs"})

    def __init__(self, formats: Optional[Sequence[str]] = None, ring_rows: int = 8) -> None:
        self.requested = None if formats is None else tuple(formats)
        self.ring_rows = ring_rows
        #: The formats watched; None until settled (see the module docstring).
        self.watched: Optional[tuple[str, ...]] = self.requested if self.requested else None
        #: The format the run computes in ("bf16", "fp16"), or None for float32.
        self.compute_format: Optional[str] = None
        self.settled = False
        self.rows: list[TensorRow] = []
        self.layout = BinLayout.default()

    # -- setup ----------------------------------------------------------------------------
    def setup(self, host: ProbeHost) -> None:
        self.host = host
        act_modules = [(slot, name, m) for slot, (name, m) in enumerate(host.map.modules)
                       if not isinstance(m, VALUE_PRESERVING)]
        self._act_row = [-1] * len(host.map.modules)
        for slot, name, _ in act_modules:
            self._act_row[slot] = len(self.rows)
            self.rows.append(TensorRow(name, "activation"))
        self._outputs = [m for _, _, m in act_modules]
        owners: dict[str, int] = {}
        self._grad_row: dict[int, int] = {}
        for name, p in host.params:
            owner = host.map.param_owner.get(name, name.rpartition(".")[0])
            if owner not in owners:
                owners[owner] = len(self.rows)
                self.rows.append(TensorRow(owner, "gradient"))
            self._grad_row[id(p)] = owners[owner]
        self.monitor = PrecisionMonitor(self.layout, self.rows)
        self.tables = DeviceTables(self.layout, host.device)
        self.buffer = torch.zeros(len(self.rows), self.tables.width, dtype=torch.int64, device=host.device)
        self._ring = HostRing(host.device, self.buffer.numel(), rows=self.ring_rows, dtype=torch.int64)
        self._scale_slot = host.ledger.block("misc").index("amp_scale")
        #: The step whose histograms the buffer holds (eager steps), -1: none.
        self._filling = -1
        self._scaled = False
        #: Intermediates on CPU (eager): one chunk's buffers, 2.5 MB, kept for the run (a fresh
        #: allocation per sample cost a third of a sample's time on the benchmark MLP, its pages
        #: faulted in again each time).
        self._workspace: Optional[Workspace] = Workspace(host.device) if host.device.type == "cpu" else None
        half = _param_format(host.param_tensors)
        if half is not None:
            self._settle(half)

    def output_modules(self, host: ProbeHost) -> Iterable[nn.Module]:
        return self._outputs

    @property
    def active(self) -> bool:
        """Whether the probe records anything (until settled: yes, to be safe)."""
        return not self.settled or bool(self.watched)

    def due(self, step: int) -> bool:
        return self.active and sampled(step)

    def _settle(self, compute: Optional[str]) -> None:
        self.compute_format = compute
        if self.requested is None:
            self.watched = (compute,) if compute else ()
        self.settled = True

    # -- events ---------------------------------------------------------------------------
    def on_root_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not self.settled:
            self._settle(_autocast_format(self.host.device.type))

    def on_output(self, slot: int, module: nn.Module, args: Any, t: torch.Tensor, compiling: bool) -> None:
        if not self.watched:
            return
        row = self._act_row[slot]
        if row < 0:
            return
        if not compiling:
            step = self.host.step
            if not sampled(step):
                return
            self._begin(step)
        if compiling or histogram_step(self.host.step):
            add_histogram(t, self.buffer[row], self.tables, workspace=None if compiling else self._workspace)
        else:
            add_amax(t, self.buffer[row], self.tables)

    def on_pre_step(self, optimizer: Optional[torch.optim.Optimizer]) -> None:
        host = self.host
        if not self.watched or not sampled(host.step):
            return
        self._begin(host.step)
        scale = host.ledger.views[self._scale_slot] if host.meta.amp else None
        self._scaled = self._scaled or scale is not None
        held = None if optimizer is None else {id(p) for g in optimizer.param_groups for p in g["params"]}
        full = histogram_step(host.step)
        for p in host.param_tensors:
            grad = p.grad
            if grad is None or (held is not None and id(p) not in held):
                continue
            if grad.is_sparse:
                grad = sparse_values(grad)
            grad = local(grad)
            if not reducible(grad):
                continue
            if full:
                add_histogram(grad, self.buffer[self._grad_row[id(p)]], self.tables, scale, self._workspace)
            elif scale is None:  # an amax sample of scaled gradients: no trend there (monitor.py)
                add_amax(grad, self.buffer[self._grad_row[id(p)]], self.tables)

    def on_row_close(self, meta: StepMeta) -> None:
        if not self.watched:
            return
        if self._filling == meta.step or (self.host.traced and sampled(meta.step)):
            self._ring.push(self.buffer.view(-1), (meta.step, self._scaled, histogram_step(meta.step)))
            self._filling = -1
            self._scaled = False
        if self._ring.pending():
            self._publish_landed()

    def on_row_closed(self, step: int) -> None:
        if self.host.traced and self.watched:
            self.buffer.zero_()  # the compiled graph adds into it every step

    def close(self) -> None:
        self.buffer = torch.zeros(0, dtype=torch.int64)
        self._workspace = None

    # -- helpers --------------------------------------------------------------------------
    def _begin(self, step: int) -> None:
        """Start the buffer afresh for ``step`` (eager steps; a compiled graph has already added
        its outputs, so there the buffer is cleared at the end of every step instead)."""
        if self._filling != step and not self.host.traced:
            self.buffer.zero_()
            self._scaled = False
        self._filling = step

    def _publish_landed(self) -> None:
        """Rows of the samples whose copy landed, as this step's fact (host work, no wait)."""
        width = self.tables.width
        formats = self.watched or ()
        rows: list[PrecisionRow] = []
        for (step, scaled, full), values in self._ring.drain(block=False):
            table = values.reshape(len(self.rows), width)
            rows.extend(self.monitor.derive(Sample(step, table[:, :-1], table[:, -1], scaled, full), formats,
                                            self.compute_format))
        if rows:
            self.host.publish(PrecisionRows(tuple(rows), formats, self.compute_format))


def histogram_step(step: int) -> bool:
    """Whether the sampled ``step`` takes histograms: the first three steps, then the sampled
    steps after step 9 (every tenth, then every fiftieth). Steps 3-9, sampled for the other
    probes, take only each tensor's ``amax``, for the overflow trend: a histogram there cost the
    first 100 steps a third more (CNN: 19 histogram samples instead of 12), where the trend
    needs the points (with histograms on steps 0-2 and every tenth only, the overflow of the
    runs that overflow by step 56 was predicted off by more than two steps) and the underflow
    rule its three samples, steps 0-2."""
    return sampled(step, first=3)


def _param_format(params: list[torch.Tensor]) -> Optional[str]:
    """"bf16"/"fp16" when most trainable elements are of that dtype (lazy parameters that are
    not materialised yet do not count)."""
    by_dtype: dict[torch.dtype, int] = {}
    for p in params:
        if materialized(p) and p.is_floating_point():
            by_dtype[p.dtype] = by_dtype.get(p.dtype, 0) + p.numel()
    if not by_dtype:
        return None
    return _HALF.get(max(by_dtype, key=by_dtype.__getitem__))


def _autocast_format(device_type: str) -> Optional[str]:
    """"bf16"/"fp16" when autocast is on for ``device_type`` with that dtype."""
    try:
        if not torch.is_autocast_enabled(device_type):
            return None
        dtype = torch.get_autocast_dtype(device_type)
    except (AttributeError, TypeError, RuntimeError):  # torch < 2.4 spells these per device
        return None
    return _HALF.get(dtype)
