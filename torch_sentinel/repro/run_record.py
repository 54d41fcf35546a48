"""What attach() records for reproducibility: the manifest, and incident bundles on failure."""

from __future__ import annotations

from typing import Optional

from ..sinks.base import SinkContext
from .incident import IncidentRecorder
from .manifest import build_manifest, finalize, write_manifest
from .view import SentinelView

__all__ = ["RunRecord"]


class RunRecord:
    """Fills ``sentinel.manifest`` (before the sinks read it), writes ``manifest.json`` on the
    writer rank, and, with a ``log_dir``, installs the incident recorder. :meth:`close`
    completes the manifest with the run's final figures."""

    def __init__(self, sentinel: SentinelView, sink_context: SinkContext) -> None:
        self._sentinel = sentinel
        opts = sentinel.options
        self._sink_context = sink_context
        self.log_dir: Optional[str] = sink_context.log_dir
        self.is_writer = sink_context.is_writer
        writes = self.log_dir is not None and self.is_writer
        sentinel.manifest.update(build_manifest(
            sentinel.root, sentinel.optimizers, seed=opts.seed, with_git=writes, rank=sentinel.rank,
        ))
        sentinel.manifest["check_mode"] = sentinel.check_mode
        if writes:
            self._write()
        self.incidents: Optional[IncidentRecorder] = (
            IncidentRecorder(sentinel, self.log_dir) if self.log_dir is not None else None
        )

    def close(self) -> None:
        s = self._sentinel
        finalize(s.manifest, s.recent_records(), s.step, s.findings)
        if self.log_dir is not None and self.is_writer:
            self._write()

    def _write(self) -> None:
        """An unwritable log_dir or a full disk must not stop training: one warning, shared
        with the sinks, and the manifest stays available as ``sentinel.manifest``."""
        assert self.log_dir is not None
        try:
            write_manifest(self.log_dir, self._sentinel.manifest)
        except OSError as exc:
            self._sink_context.log_dir_failure("writing manifest.json", exc)
