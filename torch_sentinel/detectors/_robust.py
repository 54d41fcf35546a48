"""Robust centre and spread: the median, and the median absolute deviation scaled to a
standard deviation.

One definition for the loss-spike watch, the first-mover baselines and the loss history's noise
band, so that "N robust deviations" means the same everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Union

import numpy as np

__all__ = ["MAD_TO_SIGMA", "mad_sigma", "median"]

#: 1.4826 * MAD estimates the standard deviation of normal data.
MAD_TO_SIGMA = 1.4826


def mad_sigma(values: np.ndarray, center: float) -> float:
    """``1.4826 * median(|values - center|)``: a standard deviation that outliers do not move."""
    return median(np.abs(values - center)) * MAD_TO_SIGMA


def median(values: Union[np.ndarray, Sequence[float]]) -> float:
    """``np.median`` of the values, as a float: nan when one is nan, or when there are none.

    The detectors take a few dozen medians of short series every window; ``np.median``'s
    generic machinery (axes, ``out``, its NaN check) costs about ten times the sort itself.
    """
    ordered = np.sort(np.asarray(values), axis=None)
    n = ordered.size
    if n == 0:
        return math.nan
    if ordered.dtype.kind in "fc" and ordered[-1] != ordered[-1]:  # NaN sorts last
        return math.nan
    k = n // 2
    return float(ordered[k]) if n % 2 else float((ordered[k - 1] + ordered[k]) / 2)
