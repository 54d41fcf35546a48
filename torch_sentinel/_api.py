"""``attach()`` and :class:`Sentinel`: wiring and lifecycle.

The Sentinel owns a :class:`~torch_sentinel._collect.collector.Collector` (device side), the
detectors (host side), the sinks, and the findings. Records reach it on the training thread,
at the next hook or step call after their copy to the host has landed.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Optional, Union

import torch
from torch import nn

from ._collect.collector import Collector
from ._collect.model_map import unwrap_model
from ._collect.probe import Probe
from ._collect.probes.clip import ClipProbe
from ._compile import HookLiveness
from ._distributed import RankSync, gather_findings
from ._errors import NonFiniteError, SentinelError, format_message, without_our_frames
from ._fault_policy import FaultPolicy
from ._findings import Finding
from ._findings_log import FindingLog, safely
from ._lifecycle import dump_state, forget, load_state
from ._lockstep import Lockstep
from ._model_side import ModelSide, ModelSideHandle
from ._options import Options, resolve_check_mode
from ._record import StepRecord
from ._record.fault import Fault
from ._replicas import ReplicaCheck
from ._run_context import run_context
from ._window import Window
from .detectors import default_detectors, install_probes
from .detectors.nonfinite import NonFiniteDiagnosis, locate
from .diagnosis import Report
from .precision.probe import PrecisionProbe
from .repro.run_record import RunRecord
from .shapes.watch import install_shape_notes
from .sinks import SinkContext, build_sinks

__all__ = ["Sentinel"]

logger = logging.getLogger("torch_sentinel")

class Sentinel(ModelSideHandle):
    """The handle returned by :func:`attach`. Use it as a context manager, or call
    :meth:`detach` when done; either way, everything it installed is removed exactly."""

    def __init__(self, model: nn.Module, optimizers: list[torch.optim.Optimizer], options: Options) -> None:
        self.options = options
        root = unwrap_model(model)
        self._model_name = type(root).__name__
        self._detached = False
        #: The step in progress when the sentinel was closed (the collector goes with the model).
        self._closed_at = options.start_step
        self.rank = _rank()
        self._log = FindingLog([])
        self._window = Window(options.flush_every, self._log)
        self._faults = FaultPolicy(options.on_nonfinite, self._log, self.rank, self)

        collector = Collector(model, optimizers, immediate=False, update_every=0, on_record=self._on_record,
                              thresholds=options.thresholds)
        # Everything that refers to the model lives in `side`, owned by the model; this object
        # holds it weakly (see _model_side.py). `_pinned` holds it while it closes us.
        side = ModelSide(model, root, optimizers, collector, self._on_model_collected)
        self._hold(side)
        self.check_mode = resolve_check_mode(options.check, collector.device.type)
        collector.immediate = self.check_mode == "immediate"
        if options.update_every is not None:
            collector.update_every = options.update_every
        elif collector.update_copy_bytes <= options.update_copy_limit_bytes:
            collector.update_every = 10
        collector.fault_handler = self._on_immediate_fault
        collector.number_steps(options.start_step, options.step_source)
        c = collector
        side.context = context = run_context(c, optimizers, options.thresholds, self.rank)
        self._core_width = c.ledger.width
        side.nonfinite = NonFiniteDiagnosis(context)
        # Low-precision headroom: the probe is built from attach(precision=...) (None: the
        # dtype the run computes in); precision=() switches it off, its detectors with it.
        precision_off = frozenset({"precision_overflow", "precision_underflow"}) if options.precision == () else frozenset()
        side.detectors = default_detectors(options.disable | precision_off) + list(options.detectors)
        for d in side.detectors:
            d.bind(context)
        if options.precision != ():
            c.add_probe(PrecisionProbe(options.precision))
        install_probes(c, side.detectors)
        side.nonfinite.use_weight_norms(side.detectors)
        # After the core width: norms before clipping, from the loop's own clip calls.
        c.add_probe(ClipProbe())
        # Under torch.distributed, ranks agree on non-finite faults before anyone raises, and
        # compare replicas every `replica_check_every` steps (_replicas/), at the training
        # forwards of `model`, which every rank runs alike (_lockstep.py).
        side.lockstep = Lockstep.maybe(model, c)
        side.ranks = RankSync.maybe(
            options.sync_ranks, side.lockstep, c, c.forward_order, self._core_width, self._handle_agreed_fault
        )
        ReplicaCheck.maybe(model, side.lockstep, c, options, side.detectors, self._record_finding, side.ranks)
        # It keeps the modules (to drop their compiled code): model side.
        side.liveness = HookLiveness.for_collector(
            c, context.param_owner, self._model_name, options.blind_hooks
        )
        self.manifest: dict[str, Any] = {}
        sink_context = SinkContext(
            log_dir=_rank_log_dir(options.log_dir, self.rank, options.per_rank_logs),
            log_every=options.log_every,
            rank=self.rank,
            is_writer=self.rank in (None, 0) or options.per_rank_logs,
            manifest=self.manifest,
            module_names=c.module_names,
            param_owner=context.param_owner,
            module_log_every=options.module_log_every,
        )
        # Fills the manifest before the sinks read it; writes manifest.json; incident bundles.
        self._run_record = RunRecord(self, sink_context)
        self._log.sinks.extend(build_sinks(sink_context))
        try:
            c.install()
            install_shape_notes(c, self._record_finding, self.rank)
        except BaseException:
            # Nothing half-installed stays behind: hooks, patches, open event files.
            self._detached = True
            side.closed()
            c.close()
            self._log.close()
            raise
        # Structural verdicts (from the model and optimizers alone) come before the first step.
        for d in side.detectors:
            self._window.conclude(d)

    # ------------------------------------------------------------------ public
    @property
    def step(self) -> int:
        """Optimizer steps completed so far (the 0-based index of the step in progress)."""
        side = self._live_side()
        return side.collector.step if side is not None and not self._detached else self._closed_at

    @property
    def findings(self) -> list[Finding]:
        return list(self._log.findings)

    @property
    def nonfinite_raised(self) -> int:
        """NonFiniteErrors raised so far (under ``on_nonfinite="raise"``, one per faulty step)."""
        return self._faults.raised

    @property
    def on_nonfinite_callbacks(self) -> list[Callable[[NonFiniteError, Any], None]]:
        """Called with (error, sentinel) before a NonFiniteError is raised or recorded."""
        return self._faults.callbacks

    @property
    def root(self) -> nn.Module:
        """The attached model without its DDP / ``torch.compile`` wrappers (a SentinelError
        once it was garbage-collected)."""
        return self._side().root

    def recent_records(self) -> list[StepRecord]:
        """The last step records that reached the host (up to 64), oldest first."""
        return list(self._window.recent)

    def add_probe(self, probe: Probe) -> None:
        """Add a probe (see ``torch_sentinel._collect.probe``); removed at detach.

        Args:
            probe: set up at once and scheduled for the events it implements.
        """
        self._collector.add_probe(probe)

    @property
    def attached(self) -> bool:
        return not self._detached

    def observe_loss(self, loss: torch.Tensor) -> None:
        """Record this step's training loss explicitly; it wins over the captured one."""
        if not isinstance(loss, torch.Tensor):
            loss = torch.tensor(float(loss))
        if not self._detached:
            self._collector.observe_loss(loss)

    def observe_validation(self, loss: Union[torch.Tensor, float]) -> None:
        """Record a validation loss at the current step (for the curve detectors)."""
        if not self._detached:
            self._collector.observe_validation(loss)

    def note(self, symptom: str = "", hypothesis: str = "", change: str = "", **fields: Any) -> None:
        """Add an entry to the experiment log (symptom, hypothesis, one change)."""
        self._log.note({"kind": "note", "step": self.step, "symptom": symptom, "hypothesis": hypothesis,
                        "change": change, **fields})

    def add_sink(self, sink: Any) -> None:
        """Also send each flushed window of step records, and each new finding, to ``sink``.

        Args:
            sink: an object with ``write(records, findings)`` and ``close()`` (called at
                detach), like the built-in sinks; see :class:`torch_sentinel.sinks.Sink`.
        """
        self._log.sinks.append(sink)

    def flush(self) -> None:
        """Bring every pending row to the host and run the detectors (cold path: may sync)."""
        if not self._detached:
            self._faults.flushing = True
            try:
                self._collector.drain(block=True)
                pending = self._collector.take_pending_validation()
                if pending is not None:
                    self._on_record(pending)
            except SentinelError as err:  # a fault in a landed row: raised from the user's call
                raise without_our_frames(err)  # noqa: B904 - the same error, its traceback shortened
            finally:
                self._faults.flushing = False
        self._flush_window()
        # Windows reach the sinks' files in the background (TensorBoard: within a few seconds);
        # an explicit flush puts everything on disk now.
        self._log.flush()

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to resume watching: the step count, the detectors' windows
        and the findings already reported. Save it next to the model's and optimizer's state
        (``torch.save({"model": ..., "optimizer": ..., "sentinel": sentinel.state_dict()})``)
        and pass it to :meth:`load_state_dict` right after ``attach()`` in the resumed run.

        Pending rows are flushed first (cold path). The dict holds only tensors, numbers,
        strings, lists, dicts, None and bools, so it loads with ``torch.load(...,
        weights_only=True)``; a detector attribute that is not plain data raises here.
        """
        self.flush()
        return dump_state(self.step, self._faults.reported, self._log.findings, self._detectors)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: step numbering (TensorBoard, findings, incidents)
        continues from the saved step, the detectors go on with their windows, and findings
        already reported are not reported again. Call it right after ``attach()``.

        Args:
            state: the dict :meth:`state_dict` returned.
        """
        if self.step != self.options.start_step or self._window.records or self._window.recent:
            raise SentinelError(format_message(
                "Sentinel.load_state_dict() came after steps were recorded",
                expected="load_state_dict() right after attach(), before the first step",
                arrived=f"{self.step - self.options.start_step} step(s) already recorded by {self!r}",
                next_check="move load_state_dict() before the training loop",
            ))
        step, reported, findings = load_state(state, self._detectors, self._collector.device)
        self._collector.start_at(step)
        self._log.add(findings)
        self._faults.reported = self._faults.reported or reported

    def continue_from(self, previous: Sentinel) -> None:
        """Go on from ``previous``, detached from the same model (``attach()`` on an attached
        model): its findings are this sentinel's too, and are not reported again.

        Args:
            previous: the sentinel this one replaces.
        """
        self._log.add(previous.findings)
        self._faults.reported = self._faults.reported or any(f.kind == "non_finite" for f in previous.findings)

    def report(self, *, all_ranks: Optional[bool] = None) -> Report:
        """Flush pending evidence and return the diagnosis.

        Under torch.distributed (with ``sync_ranks``), the findings of every rank are gathered,
        so ``report()`` is a collective there: call it on every rank, or pass
        ``all_ranks=False`` for this rank's findings only. As a collective it also runs the
        last cross-rank agreement (it may raise the NonFiniteError of the last steps on every
        rank) and the last replica check (_lockstep.py).
        """
        self.flush()
        if all_ranks is None:
            all_ranks = self._ranks is not None
        lockstep = self._lockstep
        if all_ranks and lockstep is not None and not self._detached:
            try:
                lockstep.at_report()
            except SentinelError as err:  # the last steps' fault, agreed: raised on every rank
                raise without_our_frames(err)  # noqa: B904 - the same error, its traceback shortened
        for d in self._detectors:
            self._window.conclude(d, final=True)
        findings = list(self._log.findings)
        if all_ranks:
            findings = gather_findings(findings)
        return Report(findings=findings, steps=self.step, notes=list(self._log.notes))

    def detach(self, *, quiet: bool = False) -> None:
        """Remove every hook and patch; idempotent. Pending evidence is flushed first.

        Args:
            quiet: log a failing flush instead of raising it (use it while another exception
                is propagating, so it is never masked).
        """
        self._detach(quiet=quiet)

    def _detach(self, quiet: bool) -> None:
        if self._detached:
            return
        side = self._live_side()
        if side is None:
            return  # the model is being collected: its side closes this sentinel (_on_model_collected)
        try:
            if quiet:
                try:
                    self.flush()
                except Exception as exc:  # the user's own exception is already propagating
                    logger.debug("flush at detach failed: %s", exc)
            else:
                self.flush()
        finally:
            self._closed_at = side.collector.step
            self._detached = True
            side.closed()
            # Verdicts that need the whole run reach the sinks (findings.jsonl, TensorBoard)
            # even when report() is never called; findings already reported are not repeated.
            for d in side.detectors:
                safely(self._window.conclude, d, True)
            side.collector.close()
            safely(self._run_record.close)
            self._log.close()
            forget(side.root, self)

    def close_unattended(self) -> None:
        """Detach without the user: at interpreter exit, or when the sentinel or its model is
        collected. Nothing may escape from here (there is no caller to catch it). Internal:
        the seam for ``_lifecycle`` (the exit hook) and the model side's finalizer; users call
        :meth:`detach`."""
        try:
            self._detach(quiet=True)
        except BaseException as exc:
            logger.warning("torch_sentinel: closing the sentinel failed: %s", exc)

    def __del__(self) -> None:
        # A model and sentinel dropped without detach() (a notebook cell run again, a sweep)
        # are collected together; close here so that the last window reaches the sinks and the
        # process-wide patches go once the last sentinel is gone. getattr: the constructor
        # may have failed before _detached existed.
        if not getattr(self, "_detached", True):
            self.close_unattended()

    def __enter__(self) -> Sentinel:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._detach(quiet=exc_type is not None)

    def __repr__(self) -> str:
        state = "detached" if self._detached else f"step {self.step}"
        return f"<Sentinel {self._model_name} check={self.check_mode!r} {state}>"

    # ------------------------------------------------------------------ internals
    def _on_record(self, record: StepRecord) -> None:
        side = self._side()
        liveness = side.liveness
        if liveness is not None and not liveness.settled:
            liveness.observe(record, side.collector.step)
        full = self._window.add(record)
        fault = locate(record, self.context, self._core_width) if self._faults.watching(record.step) else None
        if fault is not None:
            self._flush_window()
            self._faults.handle(fault, side.collector, side.ranks, self._nonfinite, self._window.recent)
        elif full:
            self._flush_window()

    def _on_immediate_fault(self, fault: Fault) -> None:
        side = self._side()
        self._faults.on_immediate(fault, side.collector, self.context, self._core_width, side.ranks,
                                  self._partial_to_sinks, self._nonfinite, self._window.recent)

    def _partial_to_sinks(self, partial: StepRecord) -> None:
        self._flush_window()
        self._log.write([partial], [])

    def _handle_agreed_fault(self, fault: Fault, rank: int) -> None:
        self._faults.decide(fault, rank, self._collector, self._nonfinite, self._window.recent)

    def _flush_window(self) -> None:
        self._window.flush(self._detectors)

    def _record_finding(self, finding: Finding) -> None:
        self._log.add([finding], write=True)


def _rank_log_dir(log_dir: Optional[str], rank: Optional[int], per_rank: bool) -> Optional[str]:
    """With per-rank logs, each rank writes its own TensorBoard run: ``<log_dir>/rank<r>``."""
    if log_dir is None or rank is None or not per_rank:
        return log_dir
    return os.path.join(log_dir, f"rank{rank}")


def _rank() -> Optional[int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return None
