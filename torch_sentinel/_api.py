"""``attach()`` and :class:`Sentinel`: wiring and lifecycle.

The Sentinel owns a :class:`~torch_sentinel._collect.collector.Collector` (device side), the
detectors (host side), the sinks, and the findings. Records reach it on the training thread,
at the next hook or step call after their copy to the host has landed.
"""

from __future__ import annotations

import collections
import logging
import os
import warnings
from typing import Any, Callable, Optional, Union

import torch
from torch import nn

from ._collect.collector import Collector
from ._collect.model_map import unwrap_model
from ._collect.probe import Probe
from ._collect.probes.clip import ClipProbe
from ._compile import HookLiveness, first_fault_in_row
from ._distributed import RankSync, gather_findings
from ._errors import NonFiniteError, SentinelError, format_message, without_our_frames
from ._findings import Finding
from ._lifecycle import dump_state, forget, load_state
from ._model_side import ModelSide, ModelSideHandle
from ._options import Options, resolve_check_mode
from ._record import StepRecord
from ._record.fault import Fault
from .detectors import Detector, RunContext, default_detectors, install_probes
from .detectors.nonfinite import NonFiniteDiagnosis, locate
from .diagnosis import Report
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
        self._findings: list[Finding] = []
        self._finding_keys: set[tuple[str, Optional[str], str]] = set()
        self._window: list[StepRecord] = []
        self._recent: collections.deque[StepRecord] = collections.deque(maxlen=64)
        self._nonfinite_reported = False
        self._flushing = False
        #: The last step a NonFiniteError was raised for (-1: none yet).
        self._raised_through = -1
        #: NonFiniteErrors raised so far (under on_nonfinite="raise", one per faulty step).
        self.nonfinite_raised = 0
        self._notes: list[dict[str, Any]] = []
        #: Called with (error, sentinel) before a NonFiniteError is raised or recorded.
        self.on_nonfinite_callbacks: list[Callable[[NonFiniteError, Sentinel], None]] = []
        self.rank = _rank()

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
        collector.on_fault = self._on_immediate_fault
        collector.number_steps(options.start_step, options.step_source)
        c = collector
        held = {id(q) for o in optimizers for g in o.param_groups for q in g["params"]}
        names = {id(p): n for n, p in c.params}
        side.context = context = RunContext(
            module_names=c.module_names,
            module_types={n: type(m).__name__ for n, m in c.map.modules},
            param_names=[n for n, _ in c.params],
            param_owner={n: c.map.param_owner.get(n, n.rpartition(".")[0]) for n, _ in c.params},
            # Without an optimizer the loop updates the weights itself: every trainable
            # parameter is then "held" (no_update and no_gradient watch them all).
            optimizer_params={n for n, p in c.params if id(p) in held} if optimizers
            else {n for n, p in c.params if p.requires_grad},
            forward_order=c.forward_order,
            thresholds=dict(options.thresholds),
            rank=self.rank,
            exact_norms=c.ledger.host_view is not None,
            adversarial=lambda: c.adversarial,
            optimizer_groups=[[names[id(q)] for g in o.param_groups for q in g["params"] if id(q) in names]
                              for o in optimizers],
            optimizer_types=[type(o).__name__ for o in optimizers],
            trainable={n for n, p in c.params if p.requires_grad},
            param_dtypes={n: p.dtype for n, p in c.params},
            in_progress=c.step_in_progress,
        )
        self._core_width = c.ledger.width
        side.nonfinite = NonFiniteDiagnosis(context)
        side.detectors = default_detectors(options.disable) + list(options.detectors)
        for d in side.detectors:
            d.bind(context)
        install_probes(c, side.detectors)
        # After the core width: norms before clipping, from the loop's own clip calls.
        c.add_probe(ClipProbe())
        # Under torch.distributed, ranks agree on non-finite faults before anyone raises.
        side.ranks = RankSync.maybe(
            options.sync_ranks, c, c.forward_order, self._core_width, self._handle_agreed_fault
        )
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
        self._sinks = build_sinks(sink_context)
        try:
            c.install()
            install_shape_notes(c, self._record_finding, self.rank)
        except BaseException:
            # Nothing half-installed stays behind: hooks, patches, open event files.
            self._detached = True
            side.closed()
            c.close()
            for sink in self._sinks:
                self._safe(sink.close)
            raise
        # Structural verdicts (from the model and optimizers alone) come before the first step.
        for d in side.detectors:
            self._finish_window_of(d, [])

    # ------------------------------------------------------------------ public
    @property
    def step(self) -> int:
        """Optimizer steps completed so far (the 0-based index of the step in progress)."""
        side = self._live_side()
        return side.collector.step if side is not None and not self._detached else self._closed_at

    @property
    def findings(self) -> list[Finding]:
        return list(self._findings)

    @property
    def root(self) -> nn.Module:
        """The attached model without its DDP / ``torch.compile`` wrappers (a SentinelError
        once it was garbage-collected)."""
        return self._side().root

    def recent_records(self) -> list[StepRecord]:
        """The last step records that reached the host (up to 64), oldest first."""
        return list(self._recent)

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
        entry = {"kind": "note", "step": self.step, "symptom": symptom, "hypothesis": hypothesis,
                 "change": change, **fields}
        self._notes.append(entry)
        for sink in self._sinks:
            write_note = getattr(sink, "write_note", None)
            if write_note is not None:
                self._safe(write_note, entry)

    def add_sink(self, sink: Any) -> None:
        """Also send each flushed window of step records, and each new finding, to ``sink``.

        Args:
            sink: an object with ``write(records, findings)`` and ``close()`` (called at
                detach), like the built-in sinks; see :class:`torch_sentinel.sinks.Sink`.
        """
        self._sinks.append(sink)

    def flush(self) -> None:
        """Bring every pending row to the host and run the detectors (cold path: may sync)."""
        if not self._detached:
            self._flushing = True
            try:
                self._collector.drain(block=True)
                if self._ranks is not None:
                    self._ranks.settle()
                pending = self._collector.take_pending_validation()
                if pending is not None:
                    self._on_record(pending)
            except SentinelError as err:  # a fault in a landed row: raised from the user's call
                raise without_our_frames(err)  # noqa: B904 - the same error, its traceback shortened
            finally:
                self._flushing = False
        self._flush_window()
        # Windows reach the sinks' files in the background (TensorBoard: within a few seconds);
        # an explicit flush puts everything on disk now.
        for sink in self._sinks:
            flush = getattr(sink, "flush", None)
            if flush is not None:
                self._safe(flush)

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
        return dump_state(self.step, self._nonfinite_reported, self._findings, self._detectors)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: step numbering (TensorBoard, findings, incidents)
        continues from the saved step, the detectors go on with their windows, and findings
        already reported are not reported again. Call it right after ``attach()``.

        Args:
            state: the dict :meth:`state_dict` returned.
        """
        if self.step != self.options.start_step or self._window or self._recent:
            raise SentinelError(format_message(
                "Sentinel.load_state_dict() came after steps were recorded",
                expected="load_state_dict() right after attach(), before the first step",
                arrived=f"{self.step - self.options.start_step} step(s) already recorded by {self!r}",
                next_check="move load_state_dict() before the training loop",
            ))
        step, reported, findings = load_state(state, self._detectors, self._collector.device)
        self._collector.start_at(step)
        for f in findings:
            key = (f.kind, f.module, f.boundary)
            if key not in self._finding_keys:
                self._finding_keys.add(key)
                self._findings.append(f)
        self._nonfinite_reported = self._nonfinite_reported or reported

    def continue_from(self, previous: Sentinel) -> None:
        """Go on from ``previous``, detached from the same model (``attach()`` on an attached
        model): its findings are this sentinel's too, and are not reported again.

        Args:
            previous: the sentinel this one replaces.
        """
        for f in previous.findings:
            key = (f.kind, f.module, f.boundary)
            if key not in self._finding_keys:
                self._finding_keys.add(key)
                self._findings.append(f)
        self._nonfinite_reported = self._nonfinite_reported or any(f.kind == "non_finite" for f in previous.findings)

    def report(self, *, all_ranks: Optional[bool] = None) -> Report:
        """Flush pending evidence and return the diagnosis.

        Under torch.distributed (with ``sync_ranks``), the findings of every rank are gathered,
        so ``report()`` is a collective there: call it on every rank, or pass
        ``all_ranks=False`` for this rank's findings only.
        """
        self.flush()
        for d in self._detectors:
            self._finish_detector(d)
        findings = list(self._findings)
        if all_ranks is None:
            all_ranks = self._ranks is not None
        if all_ranks:
            findings = gather_findings(findings)
        return Report(findings=findings, steps=self.step, notes=list(self._notes))

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
                self._safe(self._finish_detector, d)
            side.collector.close()
            self._safe(self._run_record.close)
            for sink in self._sinks:
                self._safe(sink.close)
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
        self._window.append(record)
        self._recent.append(record)
        fault = locate(record, self.context, self._core_width) if self._watching(record.step) else None
        if fault is not None:
            self._flush_window()
            self._handle_fault(fault)
        elif len(self._window) >= self.options.flush_every:
            self._flush_window()

    def _watching(self, step: int) -> bool:
        """Whether a non-finite value at ``step`` is still reported. Under "raise", every step
        with one raises (a loop that catches the error and skips the batch stays protected);
        under "warn" and "record", the first one is reported and later ones are consequences."""
        if not self._nonfinite_reported:
            return True
        # flush(), report() and detach() are not training steps: once the user was told, rows
        # they bring to the host are consequences, not a new batch to skip.
        return self.options.on_nonfinite == "raise" and step > self._raised_through and not self._flushing

    def _on_immediate_fault(self, fault: Fault) -> None:
        # Under "raise" the row of a raised step was abandoned: a fault at the same step number
        # is the next batch, after the loop skipped the bad one.
        if self._nonfinite_reported and self.options.on_nonfinite != "raise":
            return
        fault = first_fault_in_row(self._collector, self.context, self._core_width, fault)
        if self._ranks is None and self.options.on_nonfinite == "raise" and not _overflow_only(fault):
            # The error leaves from inside a hook, mid-step: the rows before it and what this
            # step saw up to the fault (the nonfinite/* point at the bad step) reach the sinks
            # first, and the step starts again from clean slots if the loop skips the batch.
            partial = self._collector.abandon_row()
            self._flush_window()
            for sink in self._sinks:
                self._safe(sink.write, [partial], [])
        self._handle_fault(fault)

    def _handle_fault(self, fault: Fault) -> None:
        if self._ranks is not None:
            # Raising on this rank alone would hang the others in their next collective: hold
            # the evidence; RankSync calls _handle_agreed_fault on every rank at the same step.
            self._ranks.hold(fault)
            self._collector.immediate = False
            return
        self._raise_fault(fault, self.rank)

    def _handle_agreed_fault(self, fault: Fault, rank: int) -> None:
        self._raise_fault(fault, rank)

    def _raise_fault(self, fault: Fault, rank: Optional[int]) -> None:
        if _overflow_only(fault):
            # Exact counts of the tensor itself found nothing: every value is finite in its own
            # dtype, so only a statistic of it overflowed. Never a NonFiniteError.
            logger.warning("torch_sentinel: a statistic at step %d (%s, %s) overflowed although the tensor "
                           "is finite; not reported as non-finite", fault.step, fault.boundary, fault.module)
            return
        first = not self._nonfinite_reported
        self._nonfinite_reported = True
        self._raised_through = max(self._raised_through, fault.step)
        policy = self.options.on_nonfinite
        if policy != "raise":
            self._collector.immediate = False  # one report per run; later steps are consequences
        err = self._nonfinite.error(fault, list(self._recent), rank=rank)
        if first:
            # Logged once (finding, console, incident bundle); raised every time.
            self._add_findings([self._nonfinite.finding(err)], write=True)
            for callback in self.on_nonfinite_callbacks:
                self._safe(callback, err, self)
        self.nonfinite_raised += policy == "raise"
        if policy == "raise":
            raise err
        if policy == "warn":
            warnings.warn(str(err), RuntimeWarning, stacklevel=3)

    def _flush_window(self) -> None:
        records, self._window = self._window, []
        new: list[Finding] = []
        for d in self._detectors:
            new.extend(self._detector_window(d, records))
        added = self._add_findings(new)
        for sink in self._sinks:
            self._safe(sink.write, records, added)
        for record in records:
            record.drop_decoded()
        if records:
            stats: dict[str, float] = {}
            for d in self._detectors:
                try:
                    stats.update({f"detector/{d.kind}/{k}": float(v) for k, v in d.statistics().items()})
                except Exception as exc:
                    logger.warning("torch_sentinel: statistics of %s failed: %s", type(d).__name__, exc)
            if stats:
                for sink in self._sinks:
                    write_stats = getattr(sink, "write_stats", None)
                    if write_stats is not None:
                        self._safe(write_stats, records[-1].step, stats)

    def _detector_window(self, detector: Detector, records: list[StepRecord]) -> list[Finding]:
        """``records`` through ``detector``, then its conclusions. A detector that raises
        anything but a SentinelError is a bug: logged, and training goes on."""
        try:
            for record in records:
                detector.update(record)
            return [*detector.conclude(), *detector.take_flagged()]
        except SentinelError:
            raise
        except Exception as exc:  # a detector bug must never stop training
            logger.warning("torch_sentinel: detector %s failed: %s", type(detector).__name__, exc)
            return []

    def _finish_window_of(self, detector: Detector, records: list[StepRecord]) -> None:
        self._add_findings(self._detector_window(detector, records), write=True)

    def _finish_detector(self, detector: Detector) -> None:
        self._add_findings([*detector.conclude(final=True), *detector.take_flagged()], write=True)

    def _record_finding(self, finding: Finding) -> None:
        self._add_findings([finding], write=True)

    def _add_findings(self, findings: Any, write: bool = False) -> list[Finding]:
        added = []
        for f in findings:
            key = (f.kind, f.module, f.boundary)
            if key in self._finding_keys:
                continue
            self._finding_keys.add(key)
            self._findings.append(f)
            added.append(f)
        if write and added:
            for sink in self._sinks:
                self._safe(sink.write, [], added)
        return added

    def _safe(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # logging must never stop training
            logger.warning("torch_sentinel: %s failed: %s", getattr(fn, "__qualname__", fn), exc)


def _overflow_only(fault: Fault) -> bool:
    """Exact counts of the offending tensor found no NaN/Inf: only a statistic overflowed."""
    ev = fault.evidence
    return ev.nan == 0 and ev.posinf == 0 and ev.neginf == 0


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
