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

On CPU (eager) the same steps run differently, each change measured on a 3-layer CNN's
activations, one thread:

- the intermediates go into a :class:`Workspace` the caller keeps (see ``probe.py``): a fresh
  output of a few MB costs page faults on every op, as much as the op itself;
- a large tensor goes through in chunks of ``Workspace.chunk`` elements, so the intermediates
  of one chunk stay in the L2 cache between the ops instead of four tensor-sized buffers
  streaming through memory (and evicting the activations backward is about to read);
- the counts come from ``bincount`` (on CPU its output size is a memory load, not a device
  read) over ``bin * LANES + i % LANES``: most elements of a tensor fall in a few bins, and
  consecutive increments of one counter wait on each other; spread over ``LANES`` counters per
  bin, summed afterwards, the count costs a third less.
"""

from __future__ import annotations

from typing import Optional

import torch

from .layout import KEY_SHIFT, BinLayout

__all__ = ["DeviceTables", "Workspace", "add_amax", "add_histogram"]

_ABS_MASK = 0x7FFFFFFF
#: Counters per bin in the CPU path's ``bincount``.
LANES = 4


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
        #: ``base * LANES``: the first of a bin's counters in the CPU path.
        self.base_lanes = self.base * LANES
        self.one = torch.ones((), dtype=torch.int64, device=device)

    @property
    def width(self) -> int:
        """Slots of one row: the bins, then the largest magnitude's bit pattern."""
        return self.bins + 1


class Workspace:
    """Buffers for the intermediates of the CPU path, one chunk long (eager CPU).

    Args:
        device: where they live.
        chunk: elements taken at a time; the four int32 buffers of one chunk, 2 MB at the
            default, fit a core's L2 cache.
    """

    def __init__(self, device: torch.device, chunk: int = 1 << 17) -> None:
        self.device = device
        self.chunk = chunk
        self._buffers: list[torch.Tensor] = []
        self._lanes = torch.empty(0, dtype=torch.int32, device=device)

    def take(self, n: int) -> list[torch.Tensor]:
        """Four int32 buffers of ``n <= chunk`` elements, then ``i % LANES`` for ``i < n``."""
        if not self._buffers or self._buffers[0].numel() < n:
            size = min(max(n, 1024), self.chunk)
            self._buffers = [torch.empty(size, dtype=torch.int32, device=self.device) for _ in range(4)]
            self._lanes = torch.arange(size, dtype=torch.int32, device=self.device) % LANES
        return [b[:n] for b in self._buffers] + [self._lanes[:n]]


def add_histogram(t: torch.Tensor, row: torch.Tensor, tables: DeviceTables,
                  scale: Optional[torch.Tensor] = None, workspace: Optional[Workspace] = None) -> None:
    """Add ``t``'s magnitude histogram into ``row[:bins]`` and fold its largest magnitude's
    float32 bits into ``row[bins]`` (``row``: int64, ``tables.width`` slots).

    Args:
        t: a floating tensor with at least one element (float64 is rounded to float32 first).
        row: the destination, a view into the caller's buffer.
        tables: the layout's lookup tables on ``t``'s device.
        scale: a 0-d device tensor multiplied in first (a GradScaler's scale), or None.
        workspace: buffers for the intermediates, eager CPU only (its path counts with
            ``bincount``, whose output size is a device read on an accelerator); None: the
            allocating path, for accelerators and ``torch.compile``.
    """
    flat = _float32_bits(t, scale)
    if workspace is not None:
        _add_in_chunks(flat, row, tables, workspace)
        return
    bits = torch.bitwise_and(flat, _ABS_MASK)
    key = torch.bitwise_right_shift(bits, KEY_SHIFT)
    index = tables.base.index_select(0, key)
    index += bits >= tables.cut.index_select(0, key)
    row[: tables.bins].index_add_(0, index, tables.one.expand(index.numel()))
    torch.maximum(row[tables.bins], bits.amax(), out=row[tables.bins])


def _add_in_chunks(flat: torch.Tensor, row: torch.Tensor, tables: DeviceTables, workspace: Workspace) -> None:
    """The CPU path of :func:`add_histogram` (see the module docstring): the same bins,
    counted chunk by chunk into ``LANES`` counters each."""
    bins = tables.bins
    counts: Optional[torch.Tensor] = None
    largest = row[bins]
    for start in range(0, flat.numel(), workspace.chunk):
        part = flat[start:start + workspace.chunk]
        bits, key, above, index, lanes = workspace.take(part.numel())
        torch.bitwise_and(part, _ABS_MASK, out=bits)
        torch.bitwise_right_shift(bits, KEY_SHIFT, out=key)
        torch.index_select(tables.cut, 0, key, out=above)
        torch.ge(bits, above, out=above)
        torch.index_select(tables.base_lanes, 0, key, out=index)
        index.add_(above, alpha=LANES)
        index += lanes
        chunk_counts = torch.bincount(index, minlength=bins * LANES)
        counts = chunk_counts if counts is None else counts.add_(chunk_counts)
        torch.maximum(largest, bits.amax(), out=largest)
    if counts is not None:
        row[:bins] += counts.view(bins, LANES).sum(1)


def add_amax(t: torch.Tensor, row: torch.Tensor, tables: DeviceTables) -> None:
    """Fold only ``t``'s largest magnitude's float32 bits into ``row[bins]``, as
    :func:`add_histogram` does (NaN's patterns above inf's): an ``amax`` sample, about a
    tenth of a histogram's cost."""
    bits = torch.bitwise_and(_float32_bits(t, None), _ABS_MASK)
    torch.maximum(row[tables.bins], bits.amax(), out=row[tables.bins])


def _float32_bits(t: torch.Tensor, scale: Optional[torch.Tensor]) -> torch.Tensor:
    """``t`` (times ``scale``) as float32, flat, viewed as its int32 bit patterns."""
    x = t.detach()
    if x.dtype is not torch.float32:
        x = x.float()
    if scale is not None:
        x = x * scale
    return x.reshape(-1).view(torch.int32)
