"""The histogram's bins: binades of float32 magnitudes, split where a format rounds.

A tensor's histogram counts its elements by magnitude into bins separated by *cuts*, each a
float32 bit pattern ``c``: an element is past the cut when its magnitude's bits ``|x|bits >= c``
(for non-negative floats the bit pattern orders as the value does). The cuts are

- ``nonzero`` (bits 1): zeros sit below it;
- the binade edges ``2**k`` for ``k = -134 .. 127``: the exponent histogram (binades below
  ``2**-134``, deep in float32's subnormals, are one bin: they flush to 0 in every format);
- the four rounding edges of every known format (``formats.Edge``; a strict edge at ``v`` is
  the cut ``bits(v) + 1``), the *split bins*: where an edge falls inside a binade, the binade is
  cut there, so every figure of every format is an exact count;
- ``nonfinite`` (the bits of inf): NaN and +-inf sit above it.

Bin ``i`` holds the elements past exactly ``i`` cuts. On the device the bin of an element comes
from two lookups in 65,536-entry tables indexed by the top 16 bits of ``|x|bits`` (exponent and
7 mantissa bits): the bin where that key range starts, and the one cut inside the range, if
any (``BinLayout`` checks that no range holds two). See ``histogram.py``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np

from .formats import FORMATS, Edge

__all__ = ["KEY_SHIFT", "BinLayout", "float32_bits", "float32_from_bits"]

#: ``|x|bits >> KEY_SHIFT`` indexes the lookup tables.
KEY_SHIFT = 15
_KEYS = 1 << (31 - KEY_SHIFT)
#: Binade edges kept in the histogram: 2**LOWEST_EDGE .. 2**127.
LOWEST_EDGE = -134
_INF_BITS = 0x7F800000
#: A cut no magnitude reaches (|x|bits <= 0x7FFFFFFF): "no cut in this key range".
NO_CUT = 0x7FFFFFFF


def float32_bits(value: float) -> int:
    """The bit pattern of ``value`` as float32; it must be exactly representable."""
    f = np.float32(value)
    if float(f) != value:
        raise ValueError(f"{value!r} is not exactly representable in float32")
    return int(np.array(f).view(np.int32))


def float32_from_bits(bits: np.ndarray) -> np.ndarray:
    """float64 values of float32 bit patterns (int arrays)."""
    return np.asarray(bits, dtype=np.int64).astype(np.int32).view(np.float32).astype(np.float64)


def _cut_bits(edge: Edge) -> int:
    return float32_bits(edge.value) + (1 if edge.strict else 0)


@dataclasses.dataclass(frozen=True)
class BinLayout:
    """The sorted cuts (bit patterns), what each is, and the device lookup tables.

    Attributes:
        cuts: sorted, distinct cut bit patterns; bin ``i`` lies between ``cuts[i-1]`` and
            ``cuts[i]`` (bin 0 is zero, the last bin is non-finite).
        index: cut name -> position in ``cuts`` (``"nonzero"``, ``"nonfinite"``,
            ``"binade:<k>"``, ``"<format>.<edge>"``).
    """

    cuts: tuple[int, ...]
    index: dict[str, int]

    @property
    def bins(self) -> int:
        return len(self.cuts) + 1

    @classmethod
    @functools.lru_cache(maxsize=1)
    def default(cls) -> BinLayout:
        """Binade edges and the edges of every format in ``FORMATS``."""
        named: dict[str, int] = {"nonzero": 1, "nonfinite": _INF_BITS}
        for k in range(LOWEST_EDGE, 128):
            named[f"binade:{k}"] = float32_bits(2.0**k)
        for fmt in FORMATS.values():
            for edge_name, edge in fmt.edges.items():
                named[f"{fmt.name}.{edge_name}"] = _cut_bits(edge)
        cuts = tuple(sorted(set(named.values())))
        position = {c: i for i, c in enumerate(cuts)}
        layout = cls(cuts, {name: position[bits] for name, bits in named.items()})
        layout.tables()  # checks the one-cut-per-key-range condition now
        return layout

    def position(self, name: str) -> int:
        return self.index[name]

    def tables(self) -> tuple[np.ndarray, np.ndarray]:
        """``(base, cut)``, int32 arrays indexed by ``|x|bits >> KEY_SHIFT``: the bin where the
        key's range starts, and the cut inside the range (``NO_CUT`` if none). An element's bin
        is ``base[key] + (|x|bits >= cut[key])``."""
        cuts = np.asarray(self.cuts, dtype=np.int64)
        starts = np.arange(_KEYS, dtype=np.int64) << KEY_SHIFT
        base = np.searchsorted(cuts, starts, side="right")
        inside_lo = np.searchsorted(cuts, starts, side="right")
        inside_hi = np.searchsorted(cuts, starts + (1 << KEY_SHIFT), side="left")
        count = inside_hi - inside_lo
        if count.max() > 1:
            key = int(np.argmax(count))
            raise ValueError(f"two cuts fall in key range {key} of the histogram layout")
        cut = np.full(_KEYS, NO_CUT, dtype=np.int64)
        has = count == 1
        cut[has] = cuts[inside_lo[has]]
        # NaN patterns reach 0x7FFFFFFF = NO_CUT: the key ranges past inf start one bin below the
        # non-finite bin and have a cut every pattern passes, so no pattern goes past that bin.
        nonfinite = starts >= _INF_BITS
        base[nonfinite] -= 1
        cut[nonfinite] = 0
        return base.astype(np.int32), cut.astype(np.int32)

    @staticmethod
    def tails(counts: np.ndarray) -> np.ndarray:
        """``tails[:, i]``: the elements in bins ``>= i``, per row of ``counts`` (``(rows, bins)``),
        with a last column of zeros."""
        tails = np.zeros((counts.shape[0], counts.shape[1] + 1), dtype=np.int64)
        tails[:, :-1] = np.cumsum(counts[:, ::-1], axis=1)[:, ::-1]
        return tails

    def above(self, tails: np.ndarray, names: Sequence[str]) -> np.ndarray:
        """Elements past each named cut, per row: ``tails`` from :meth:`tails`; the result is
        ``(rows, len(names))``."""
        return tails[:, [self.index[n] + 1 for n in names]]

    def lower_edges(self) -> np.ndarray:
        """The smallest magnitude each bin can hold (float64; bin 0: 0, the last: inf)."""
        return np.concatenate([[0.0], float32_from_bits(np.asarray(self.cuts))])
