"""Device side: one tensor's magnitude histogram, added into a row of a device buffer.

Tensor ops only: no host read, no data-dependent shape, so it runs inside hooks and traces
under ``torch.compile``. Per tensor (float32 after an exact upcast of half and float8 types):

    b   = |x| as its float32 bit pattern          (bitwise_and)
    key = b >> 15                                  (exponent and 7 mantissa bits)
    bin = base[key] + (b >= cut[key])              (two index_select, ge, add)
    row[:bins] += counts of bin                    (index_add_)
    row[bins]   = max(row[bins], max b)            (amax, maximum: the exact largest |x|)

``frexp`` gives the same exponent, and ``bincount`` the same counts; neither is used: on CUDA
``bincount`` reads its input's maximum back to the host to size its output (a sync), and under
``torch.compile`` its data-dependent size breaks the graph. ``index_add_`` into a fixed-size
row does neither.

On CPU a fresh output of a few MB costs page faults on every op, as much as the op itself:
there the intermediates go into a :class:`Workspace` the caller keeps (see ``probe.py``), and
the counts come from ``bincount`` (on CPU its output size is a memory load, not a device read).
"""

from __future__ import annotations

from typing import Optional

import torch

from .layout import KEY_SHIFT, BinLayout

__all__ = ["DeviceTables", "Workspace", "add_histogram"]

_ABS_MASK = 0x7FFFFFFF


class DeviceTables:
    """The layout's lookup tables on one device.

    Args:
        layout: the bins.
        device: where the histograms are computed.
    """

    def __init__(self, layout: BinLayout, device: torch.device) -> None:
        base, cut = layout.tables()
        self.bins = layout.bins
        self.base = torch.from_numpy(base).to(device)
        self.cut = torch.from_numpy(cut).to(device)
        self.one = torch.ones((), dtype=torch.int64, device=device)

    @property
    def width(self) -> int:
        """Slots of one row: the bins, then the largest magnitude's bit pattern."""
        return self.bins + 1


class Workspace:
    """Four int32 buffers for the intermediates, grown to the largest tensor seen (eager CPU).

    Args:
        device: where they live.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._buffers = [torch.empty(0, dtype=torch.int32, device=device) for _ in range(4)]

    def take(self, n: int) -> list[torch.Tensor]:
        if self._buffers[0].numel() < n:
            self._buffers = [torch.empty(n, dtype=torch.int32, device=self.device) for _ in range(4)]
        return [b[:n] for b in self._buffers]


def add_histogram(t: torch.Tensor, row: torch.Tensor, tables: DeviceTables,
                  scale: Optional[torch.Tensor] = None, workspace: Optional[Workspace] = None) -> None:
    """Add ``t``'s magnitude histogram into ``row[:bins]`` and fold its largest magnitude's
    float32 bits into ``row[bins]`` (``row``: int64, ``tables.width`` slots).

    Args:
        t: a floating tensor with at least one element (float64 is rounded to float32 first).
        row: the destination, a view into the caller's buffer.
        tables: the layout's lookup tables on ``t``'s device.
        scale: a 0-d device tensor multiplied in first (a GradScaler's scale), or None.
        workspace: buffers for the intermediates (eager only; None allocates them).
    """
    x = t.detach()
    if x.dtype is not torch.float32:
        x = x.float()
    if scale is not None:
        x = x * scale
    flat = x.reshape(-1).view(torch.int32)
    if workspace is None:
        bits = torch.bitwise_and(flat, _ABS_MASK)
        key = torch.bitwise_right_shift(bits, KEY_SHIFT)
        index = tables.base.index_select(0, key)
        index += bits >= tables.cut.index_select(0, key)
    else:
        bits, key, above, index = workspace.take(flat.numel())
        torch.bitwise_and(flat, _ABS_MASK, out=bits)
        torch.bitwise_right_shift(bits, KEY_SHIFT, out=key)
        torch.index_select(tables.cut, 0, key, out=above)
        torch.ge(bits, above, out=above)
        torch.index_select(tables.base, 0, key, out=index)
        index += above
        if index.device.type == "cpu":
            # Eager CPU: bincount counts the same bins 20% faster than index_add_'s scatter (its
            # size comes from the largest bin on the host, a memory load there; never used on an
            # accelerator, where that size is a device-to-host read). ``index < bins`` always.
            row[: tables.bins] += torch.bincount(index, minlength=tables.bins)
            torch.maximum(row[tables.bins], bits.amax(), out=row[tables.bins])
            return
    row[: tables.bins].index_add_(0, index, tables.one.expand(index.numel()))
    torch.maximum(row[tables.bins], bits.amax(), out=row[tables.bins])
