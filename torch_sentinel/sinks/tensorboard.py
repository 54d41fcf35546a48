"""TensorBoard: what the sentinel saw, as scalars, findings text, the manifest and a dashboard.

Windows of step records (host numpy already, copied out of the ring) and findings become tags
on the training thread; ``SummaryWriter``'s own queue writes them. Tags are stable and
hierarchical; see ``docs/tensorboard.md`` for the list.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any, NamedTuple, Optional

from .._findings import Finding
from .._record import StepRecord
from ..precision.probe import PrecisionRows
from .base import SinkContext
from .precision import precision_scalars
from .schedule import ModuleSchedule, module_tag_bytes
from .spike_series import spike_scalars
from .step_scalars import ROOT_TAG, StepScalars, module_tag
from .tensorboard_text import finding_markdown, flat_hparams

__all__ = ["LAYOUT", "ROOT_TAG", "StepScalars", "TensorBoardSink"]

logger = logging.getLogger("torch_sentinel")

#: The custom-scalars dashboard. Tags in charts are regular expressions.
LAYOUT: dict[str, dict[str, list[Any]]] = {
    "loss & lr": {
        "loss": ["Multiline", ["loss/train", "loss/validation"]],
        "learning rate": ["Multiline", [r"lr/.*"]],
    },
    "gradients": {
        "global gradient norm": ["Multiline", [r"grad_norm/global(_clipped)?$"]],
        "gradient norm per layer": ["Multiline", [r"grad_norm/(?!global$|global_clipped$).*"]],
    },
    "updates": {
        "update/weight ratio": ["Multiline", [r"update_ratio/.*"]],
        "AMP": ["Multiline", [r"amp/.*"]],
    },
    "activations": {
        "activation |max| per module": ["Multiline", [r"activation_absmax/.*"]],
        "dead-unit fraction per ReLU": ["Multiline", [r"dead_fraction/.*"]],
        "non-finite slots per boundary": ["Multiline", [r"nonfinite/.*"]],
    },
    "precision": {
        "headroom (bits) per module": ["Multiline", [r"precision/.*/headroom_bits$"]],
        "flushed to zero per module": ["Multiline", [r"precision/.*/flushed$"]],
        "subnormal per module": ["Multiline", [r"precision/.*/subnormal$"]],
        "saturated per module": ["Multiline", [r"precision/.*/saturated$"]],
    },
}

#: Detector statistics that also get a short tag: (prefix, suffix) -> alias prefix.
#: The dead_relu detector reports ``<module>.dead_fraction``; it shows as ``dead_fraction/<module>``.
_STAT_ALIASES = {("detector/dead_relu/", ".dead_fraction"): "dead_fraction/"}


class _Row(NamedTuple):
    """A record to write: ``full`` for the whole-model tags, ``modules`` for the per-module
    ones; neither: only its validation loss. A row with ``modules`` alone is a step whose
    per-module detail is written after its other tags (around a fault)."""

    record: StepRecord
    full: bool
    amp_skipped: Optional[int]
    modules: bool = True


class TensorBoardSink:
    """Streams the run to ``log_dir`` through ``torch.utils.tensorboard.SummaryWriter``.

    Steps with ``step % log_every == 0`` are written, plus the last step seen, so a run's end
    always shows; validation losses are written at every step that has one, since they are
    sparse already. Per-module tags are written every ``module_log_every`` steps, and in full
    around a fault (see :mod:`torch_sentinel.sinks.schedule`).

    Each flushed window is turned into events on the training thread and handed to the
    ``SummaryWriter``'s own queue, whose thread writes them to the file. The scalars of one step
    go into one event (one ``Summary`` with a value per tag, as ``tf.summary.merge_all`` wrote
    them): building it costs ~1 us a scalar instead of ~10 us through ``add_scalar``, and the
    file is smaller. The training thread never waits for the disk: the writer's thread flushes
    the file itself at most :attr:`FLUSH_SECS` seconds after an event reached it, so a live
    ``tensorboard`` sees each window within that bound, and a process killed with ``kill -9``
    leaves a file readable up to the windows flushed that long before. ``close()`` (detach, the
    interpreter's exit, an uncaught error) and :meth:`flush` (``Sentinel.flush()``) write
    everything at once. There is no second writer thread of ours.
    """

    #: Events the SummaryWriter may hold before its thread has written them: many windows of
    #: a large model (one event a step), so that adding events never waits on the disk.
    MAX_QUEUE = 4096
    #: The writer's thread flushes the event file at most this many seconds after an event
    #: reached it (it was waiting on its queue, not on the training thread).
    FLUSH_SECS = 2.0

    def __init__(self, ctx: SinkContext) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard import SummaryWriter

        assert ctx.log_dir is not None
        self._summary = Summary
        self.ctx = ctx
        self._scalars = StepScalars(ctx.param_owner)
        self._modules = ModuleSchedule(ctx.module_log_every, ctx.log_every)
        self._last: Optional[_Row] = None
        self._last_logged = -1
        self._amp_skipped: Optional[int] = None
        self._manifest_sent = False
        self._failed = False
        self._writer: Any = None
        try:
            self._writer = SummaryWriter(
                log_dir=ctx.log_dir, max_queue=self.MAX_QUEUE, flush_secs=self.FLUSH_SECS
            )
            self._writer.add_custom_scalars(LAYOUT)
            self._writer.flush()
        except Exception as exc:
            self._fail(exc)

    def write(self, records: Sequence[StepRecord], findings: Sequence[Finding]) -> None:
        if self._failed or self._writer is None:
            return
        rows: list[_Row] = []
        for r in records:
            self._count_amp(r)
            if r.step % self.ctx.log_every == 0:
                if not self._modules.decided:
                    self._modules.choose(module_tag_bytes(self._module_tags(r)))
                rows.append(_Row(r, True, self._amp_skipped, self._modules.full(r)))
                self._last_logged = r.step
            elif r.validation is not None:
                rows.append(_Row(r, False, None, False))
        # Around a fault the per-module detail is complete: the steps held back since the last
        # full step get their per-module scalars now (never earlier than a written step's).
        rows.extend(_Row(r, False, None, True) for r in self._modules.backfill(findings))
        if records:
            self._last = _Row(records[-1], True, self._amp_skipped)
        if rows or findings or self._manifest_pending():
            last_step = self._last.record.step if self._last else 0
            self._guarded(self._write_window, rows, list(findings), last_step, self._manifest())
        self._guarded(self._write_precision, records)

    def _write_precision(self, records: Sequence[StepRecord]) -> None:
        """``precision/<format>/<module>/<figure>`` (``.../grad/<figure>`` for gradients) at each
        row's sampled step, for sampled steps that are per-module steps (``module_log_every``):
        they are per-module tags too."""
        interval = self._modules.interval or self.ctx.log_every
        by_step: dict[int, list[tuple[str, float]]] = {}
        for record in records:
            fact = record.fact(PrecisionRows)
            for row in fact.rows if fact is not None else ():
                if row.step % interval == 0:
                    by_step.setdefault(row.step, []).extend(
                        precision_scalars(row, module_tag(row.module))
                    )
        for step, pairs in by_step.items():
            self._add_scalars(pairs, step)

    @property
    def module_log_every(self) -> Optional[int]:
        """Steps between writes of the per-module scalars (None until the first step)."""
        return self._modules.interval

    def _module_tags(self, record: StepRecord) -> list[str]:
        return [
            t for t, _ in self._scalars.scalars(record, self.ctx.module_names, global_tags=False)
        ]

    def write_stats(self, step: int, stats: dict[str, float]) -> None:
        if not self._failed and self._writer is not None:
            self._guarded(self._write_stats, step, dict(stats))

    def flush(self) -> None:
        """Write every event handed over so far to the file now (cold path: waits for the
        writer's thread); ``Sentinel.flush()`` calls it."""
        if not self._failed and self._writer is not None:
            self._guarded(self._writer.flush)

    def close(self) -> None:
        if self._writer is None:
            return
        last = self._last
        if not self._failed and last is not None and last.record.step > self._last_logged:
            self._guarded(self._write_window, [last], [], last.record.step, self._manifest())
        elif not self._failed and last is not None and self._modules.last_full < last.record.step:
            # The last step shows in the per-module charts too.
            self._guarded(
                self._write_window,
                [last._replace(full=False)],
                [],
                last.record.step,
                self._manifest(),
            )
        writer, self._writer = self._writer, None
        try:
            writer.close()
        except Exception as exc:  # the final flush can hit a full disk too
            self._fail(exc)

    def _guarded(self, write: Any, *args: Any) -> None:
        """Hand events to the writer's queue; its thread writes and flushes them (FLUSH_SECS).
        A failure of that thread (a full disk) surfaces at the next write."""
        try:
            write(*args)
        except Exception as exc:  # a full disk must not stop training
            self._fail(exc)

    def _count_amp(self, record: StepRecord) -> None:
        # Counted here, over every step, so that a logged step carries the true total so far.
        if record.meta.amp and self._amp_skipped is None:
            self._amp_skipped = 0
        if record.meta.amp_skipped:
            self._amp_skipped = (self._amp_skipped or 0) + 1

    def _manifest_pending(self) -> bool:
        return not self._manifest_sent and bool(self.ctx.manifest)

    def _manifest(self) -> Optional[dict[str, Any]]:
        """The manifest once it is filled (it may be after attach), as a private copy."""
        if self._manifest_sent or not self.ctx.manifest:
            return None
        self._manifest_sent = True
        return dict(json.loads(json.dumps(self.ctx.manifest, default=str)))

    def _write_window(
        self,
        rows: list[_Row],
        findings: list[Finding],
        last_step: int,
        manifest: Optional[dict[str, Any]],
    ) -> None:
        w = self._writer
        if manifest is not None:
            self._write_manifest(manifest)
        names = self.ctx.module_names
        for row in rows:
            record, step = row.record, row.record.step
            pairs: list[tuple[str, float]] = []
            if row.full or row.modules:
                pairs.extend(
                    self._scalars.scalars(
                        record,
                        names,
                        row.amp_skipped,
                        global_tags=row.full,
                        module_tags=row.modules,
                    )
                )
            validation = record.validation
            if validation is not None and (row.full or not row.modules):
                pairs.append(("loss/validation", validation))
            self._add_scalars(pairs, step)
        by_tag: dict[tuple[str, int], list[Finding]] = {}
        for f in findings:
            step = f.step if f.step is not None else last_step
            by_tag.setdefault((f"findings/{f.kind}", step), []).append(f)
        for (tag, step), group in by_tag.items():
            w.add_text(tag, finding_markdown(group), step)
        self._write_spike_series(findings)

    def _write_spike_series(self, findings: list[Finding]) -> None:
        """The series around each loss spike (``spike_series.py``), one event per step."""
        by_step: dict[int, list[tuple[str, float]]] = {}
        for f in findings:
            for step, tag, value in spike_scalars(f):
                by_step.setdefault(step, []).append((tag, value))
        for step, pairs in sorted(by_step.items()):
            self._add_scalars(pairs, step)

    def _write_stats(self, step: int, stats: dict[str, float]) -> None:
        pairs: list[tuple[str, float]] = []
        for tag, value in stats.items():
            pairs.append((tag, value))
            for (prefix, suffix), alias in _STAT_ALIASES.items():
                if tag.startswith(prefix) and tag.endswith(suffix):
                    name = tag[len(prefix) : len(tag) - len(suffix)]
                    pairs.append((alias + name, value))
        self._add_scalars(pairs, step)

    def _add_scalars(self, pairs: Sequence[tuple[str, float]], step: int) -> None:
        """One event holding every ``(tag, value)`` of ``step`` (what ``add_scalar`` writes per
        tag: a ``simple_value``; readers iterate over an event's values)."""
        if not pairs:
            return
        summary = self._summary()
        add = summary.value.add
        for tag, value in pairs:
            add(tag=tag, simple_value=float(value))
        self._writer.file_writer.add_summary(summary, step)

    def _write_manifest(self, manifest: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        self._writer.add_text(
            "run/manifest", "```json\n" + json.dumps(manifest, indent=2, default=str) + "\n```", 0
        )
        hp = flat_hparams(manifest)
        if hp:
            # Written into this run (add_hparams would start a new one); the metrics are
            # the scalar tags already streamed.
            for summary in hparams(hp, {"loss/train": 0.0, "loss/validation": 0.0}):
                self._writer.file_writer.add_summary(summary)

    def _fail(self, exc: BaseException) -> None:
        self._failed = True
        self.ctx.log_dir_failure("writing TensorBoard events", exc)
