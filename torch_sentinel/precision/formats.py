"""The low-precision formats the sentinel measures headroom in, and their rounding edges.

Every figure is about one question: what happens to a value ``x`` when it is rounded to the
format with round-to-nearest-even, as ``x.to(dtype)`` does. Four edges decide it, each a
magnitude with a side (``strict``: only magnitudes *above* the edge are past it; otherwise the
edge itself is past it, because a tie at the edge rounds away from it):

- ``flush``: at most half the smallest subnormal, ``2**(s-1)``, a value rounds to 0 (the tie at
  ``2**(s-1)`` goes to 0, the even neighbour): strict.
- ``min_subnormal_up``: from ``1.5 * 2**s`` on, a value rounds past the smallest subnormal (the
  tie goes to ``2 * 2**s``, the even one).
- ``normal``: from ``2**n - 2**(s-1)`` on, a value rounds to the smallest normal ``2**n`` (the
  largest subnormal has an odd mantissa, so the tie goes up).
- ``overflow``: from the midpoint between the largest finite value ``M`` and the next step on,
  a value rounds above ``M``. IEEE formats (bf16, fp16, e5m2) have an odd mantissa at ``M``, so
  the tie rounds up, to inf. float8 e4m3fn has no inf: torch's cast *saturates* every magnitude
  above 448 (inf included) to 448, and ``M = 448`` has an even mantissa (``1.110b``), so the tie
  at 464 stays at 448: the edge is strict, and ``saturated`` counts the magnitudes above 464,
  whose nearest value in the format would be 480 or more.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Optional

import torch

__all__ = ["ALIASES", "FORMATS", "Edge", "Format", "canonical_format"]


@dataclasses.dataclass(frozen=True)
class Edge:
    """A magnitude threshold: a value is *past* it when ``|x| > value`` (strict) or ``|x| >= value``."""

    value: float
    strict: bool


@dataclasses.dataclass(frozen=True)
class Format:
    """A binary floating-point format with ``mantissa_bits`` fraction bits.

    Args:
        name: the name used in options, tags and rows (``"fp16"``).
        dtype: the torch dtype whose cast is the reference (``x.to(dtype)``).
        mantissa_bits: explicit fraction bits (fp16: 10).
        min_normal_exp: ``n``, the smallest normal value is ``2**n``.
        max_finite: ``M``, the largest finite value.
        saturating: the cast clamps to ``M`` instead of rounding to inf (float8 e4m3fn).
    """

    name: str
    dtype: torch.dtype
    mantissa_bits: int
    min_normal_exp: int
    max_finite: float
    saturating: bool = False

    @property
    def min_subnormal_exp(self) -> int:
        """``s``: the smallest subnormal value is ``2**s``."""
        return self.min_normal_exp - self.mantissa_bits

    @property
    def min_subnormal(self) -> float:
        return math.ldexp(1.0, self.min_subnormal_exp)

    @property
    def min_normal(self) -> float:
        return math.ldexp(1.0, self.min_normal_exp)

    @property
    def max_ulp(self) -> float:
        """The spacing of the format's values just below ``M``."""
        return math.ldexp(1.0, math.frexp(self.max_finite)[1] - 1 - self.mantissa_bits)

    @functools.cached_property
    def edges(self) -> dict[str, Edge]:
        """The four rounding edges (see the module docstring), exact dyadic values."""
        s = self.min_subnormal_exp
        # The tie at M + ulp/2 rounds to the even one of M and M + ulp: M's last mantissa bit.
        m_odd = int(self.max_finite / self.max_ulp) % 2 == 1
        return {
            "flush": Edge(math.ldexp(1.0, s - 1), strict=True),
            "min_subnormal_up": Edge(1.5 * math.ldexp(1.0, s), strict=False),
            "normal": Edge(self.min_normal - math.ldexp(1.0, s - 1), strict=False),
            "overflow": Edge(self.max_finite + self.max_ulp / 2, strict=not m_odd),
        }


FORMATS: dict[str, Format] = {
    "bf16": Format("bf16", torch.bfloat16, 7, -126, math.ldexp(2.0 - 2.0**-7, 127)),
    "fp16": Format("fp16", torch.float16, 10, -14, 65504.0),
    "e4m3": Format("e4m3", torch.float8_e4m3fn, 3, -6, 448.0, saturating=True),
    "e5m2": Format("e5m2", torch.float8_e5m2, 2, -14, 57344.0),
}

#: Other spellings accepted by ``attach(precision=...)``, mapped to the names above.
ALIASES: dict[str, str] = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "e4m3fn": "e4m3",
    "float8_e4m3fn": "e4m3",
    "fp8_e4m3": "e4m3",
    "float8_e5m2": "e5m2",
    "fp8_e5m2": "e5m2",
}

_BY_DTYPE = {f.dtype: name for name, f in FORMATS.items()}


def canonical_format(value: Any) -> Optional[str]:
    """The format name for ``value`` (a name, an alias or a torch dtype), None if unknown."""
    if isinstance(value, torch.dtype):
        return _BY_DTYPE.get(value)
    if isinstance(value, str):
        key = value.strip().lower()
        return key if key in FORMATS else ALIASES.get(key)
    return None
