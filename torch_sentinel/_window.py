"""Step records on their way to the detectors: a window of ``flush_every`` records at a time.

Each record goes through every detector's ``update`` in order; then each detector concludes,
its new findings join the log, and the window goes to the sinks with them. A detector that
raises anything but a ``SentinelError`` is a bug: it is logged, and training goes on.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Sequence

from ._errors import SentinelError
from ._findings import Finding
from ._findings_log import FindingLog
from ._record import StepRecord
from .detectors import Detector

__all__ = ["Window"]

logger = logging.getLogger("torch_sentinel")


class Window:
    """The records that reached the host since the last flush, and the most recent ones.

    Args:
        flush_every: how many records make a window (``attach(flush_every=...)``).
        log: where the detectors' findings go.
    """

    def __init__(self, flush_every: int, log: FindingLog) -> None:
        self.flush_every = flush_every
        self.log = log
        self.records: list[StepRecord] = []
        #: The last records that reached the host, for the evidence of a NonFiniteError.
        self.recent: collections.deque[StepRecord] = collections.deque(maxlen=64)

    def add(self, record: StepRecord) -> bool:
        """Take ``record``; whether the window is full."""
        self.records.append(record)
        self.recent.append(record)
        return len(self.records) >= self.flush_every

    def flush(self, detectors: Sequence[Detector]) -> None:
        """The window through every detector, its new findings into the log, both to the sinks."""
        records, self.records = self.records, []
        new: list[Finding] = []
        for d in detectors:
            new.extend(run(d, records))
        added = self.log.add(new)
        self.log.write(records, added)
        for record in records:
            record.drop_decoded()
        if records:
            stats: dict[str, float] = {}
            for d in detectors:
                try:
                    stats.update({f"detector/{d.kind}/{k}": float(v) for k, v in d.statistics().items()})
                except Exception as exc:
                    logger.warning("torch_sentinel: statistics of %s failed: %s", type(d).__name__, exc)
            if stats:
                self.log.write_stats(records[-1].step, stats)

    def conclude(self, detector: Detector, final: bool = False) -> None:
        """A detector's conclusions outside a window (at attach; ``final``: the run ended)."""
        try:
            found = [*detector.conclude(final=final), *detector.take_flagged()]
        except SentinelError:
            raise
        except Exception as exc:  # a detector bug must never stop training
            logger.warning("torch_sentinel: detector %s failed: %s", type(detector).__name__, exc)
            return
        self.log.add(found, write=True)


def run(detector: Detector, records: Sequence[StepRecord]) -> list[Finding]:
    """``records`` through ``detector``, then its conclusions. A detector that raises anything
    but a SentinelError is a bug: logged, and training goes on."""
    try:
        for record in records:
            detector.update(record)
        return [*detector.conclude(), *detector.take_flagged()]
    except SentinelError:
        raise
    except Exception as exc:  # a detector bug must never stop training
        logger.warning("torch_sentinel: detector %s failed: %s", type(detector).__name__, exc)
        return []
