"""``findings.jsonl``: one JSON object per line, for every finding and experiment-log note."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import IO, Any, Optional

from .._findings import Finding
from .._record import StepRecord
from .base import SinkContext

__all__ = ["FINDINGS_FILE", "JsonlSink"]

FINDINGS_FILE = "findings.jsonl"


class JsonlSink:
    """Appends findings (``Finding.to_dict()``) and notes (``{"kind": "note", ...}``) to
    ``log_dir/findings.jsonl`` as they arrive; each line is flushed, so a crash loses nothing
    already found.

    The file is created at attach even when nothing is ever found: an empty file means the run
    was watched and stayed healthy. A rerun in the same directory appends, like TensorBoard.
    Findings are rare, so they are written on the training thread.
    """

    def __init__(self, ctx: SinkContext) -> None:
        assert ctx.log_dir is not None
        self.ctx = ctx
        self.path = os.path.join(ctx.log_dir, FINDINGS_FILE)
        self._file: Optional[IO[str]] = None
        self._failed = False
        try:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - lives until close()
        except OSError as exc:
            self._fail(exc)

    def write(self, records: Sequence[StepRecord], findings: Sequence[Finding]) -> None:
        if findings:
            self._append([f.to_dict() for f in findings])

    def write_note(self, entry: dict[str, Any]) -> None:
        self._append([entry])

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError as exc:  # the final flush can hit a full disk too
                self._fail(exc)
            self._file = None

    def _append(self, rows: list[dict[str, Any]]) -> None:
        if self._file is None or self._failed:
            return
        try:
            self._file.write("".join(json.dumps(r, default=str) + "\n" for r in rows))
            self._file.flush()
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self._failed = True
        self.ctx.log_dir_failure(f"writing {FINDINGS_FILE}", exc)
