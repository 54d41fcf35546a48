"""What attach() records for reproducibility: the manifest, and incident bundles on failure."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from .incident import IncidentRecorder
from .manifest import build_manifest, finalize, write_manifest

if TYPE_CHECKING:
    from .._api import Sentinel

__all__ = ["RunRecord"]


class RunRecord:
    """Fills ``sentinel.manifest`` (before the sinks read it), writes ``manifest.json`` on the
    writer rank, and, with a ``log_dir``, installs the incident recorder. :meth:`close`
    completes the manifest with the run's final figures."""

    def __init__(self, sentinel: Sentinel, log_dir: Optional[str]) -> None:
        self._sentinel = sentinel
        opts = sentinel.options
        self.log_dir = log_dir
        self.is_writer = sentinel.rank in (None, 0) or opts.per_rank_logs
        writes = self.log_dir is not None and self.is_writer
        sentinel.manifest.update(build_manifest(
            sentinel._root, sentinel.optimizers, seed=opts.seed, with_git=writes, rank=sentinel.rank,
        ))
        sentinel.manifest["check_mode"] = sentinel.check_mode
        if writes:
            write_manifest(self.log_dir, sentinel.manifest)  # type: ignore[arg-type]
        self.incidents: Optional[IncidentRecorder] = (
            IncidentRecorder(sentinel, self.log_dir) if self.log_dir is not None else None
        )

    def close(self) -> None:
        s = self._sentinel
        finalize(s.manifest, list(s._recent), s.step, s.findings)
        if self.log_dir is not None and self.is_writer:
            write_manifest(self.log_dir, s.manifest)
