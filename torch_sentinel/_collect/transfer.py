"""Device → host transfer: the only module that moves device values to the host.

Rows travel with a non-blocking copy into pinned memory followed by a CUDA event; the host
looks at a row only after ``event.query()`` says the copy landed, so the training thread never
waits. On CPU the copy is a memcpy and is ready at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Optional

import numpy as np
import torch

__all__ = ["AsyncFetch", "HostRing", "read_now"]


def _pinned(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_available()


def _event(device: torch.device) -> Optional[Any]:
    if device.type == "cuda":
        return torch.cuda.Event()
    return None


def read_now(t: torch.Tensor) -> float:
    """A blocking read of one device value: immediate mode on accelerators and the cold path."""
    return float(t.item())


class HostRing:
    """A ring of host rows, each filled asynchronously from the ledger's current row."""

    def __init__(self, device: torch.device, width: int, rows: int = 128, dtype: torch.dtype = torch.float32) -> None:
        self.device = device
        self.rows = rows
        self.width = width
        self.dtype = dtype
        self.host = torch.empty((rows, width), dtype=dtype, pin_memory=_pinned(device))
        self.np = self.host.numpy()
        self.events = [_event(device) for _ in range(rows)]
        self.meta: list[Any] = [None] * rows
        self.head = 0  # rows pushed
        self.tail = 0  # rows handed to the host

    def push(self, current: torch.Tensor, meta: Any) -> None:
        if self.head - self.tail >= self.rows:
            # The host fell a full ring behind the device: wait for the oldest row (cold path).
            self._wait(self.tail % self.rows)
        r = self.head % self.rows
        self.host[r, : current.numel()].copy_(current, non_blocking=True)
        ev = self.events[r]
        if ev is not None:
            ev.record()
        self.meta[r] = meta
        self.head += 1

    def _wait(self, r: int) -> None:
        ev = self.events[r]
        if ev is not None:
            ev.synchronize()

    def pending(self) -> int:
        return self.head - self.tail

    def drain(self, block: bool = False) -> Iterator[tuple[Any, np.ndarray]]:
        """Yield ``(meta, values)`` for every row whose copy has landed, oldest first."""
        while self.tail < self.head:
            r = self.tail % self.rows
            ev = self.events[r]
            if ev is not None and not ev.query():
                if not block:
                    return
                ev.synchronize()
            values = self.np[r].copy()
            meta = self.meta[r]
            self.meta[r] = None
            self.tail += 1
            yield meta, values


class AsyncFetch:
    """A one-off non-blocking copy of a few device tensors (window accumulators) to the host."""

    def __init__(self, tensors: Sequence[torch.Tensor], tag: Any = None) -> None:
        self.tag = tag
        self._host: list[torch.Tensor] = []
        device = tensors[0].device if tensors else torch.device("cpu")
        for t in tensors:
            h = torch.empty(t.shape, dtype=t.dtype, pin_memory=_pinned(t.device))
            h.copy_(t.detach(), non_blocking=True)
            self._host.append(h)
        self._event = _event(device)
        if self._event is not None:
            self._event.record()

    def ready(self) -> bool:
        return self._event is None or bool(self._event.query())

    def result(self, block: bool = False) -> Optional[list[np.ndarray]]:
        if not self.ready():
            if not block:
                return None
            assert self._event is not None
            self._event.synchronize()
        return [h.numpy() for h in self._host]
