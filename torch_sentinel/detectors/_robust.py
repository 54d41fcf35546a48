"""Robust spread: the median absolute deviation, scaled to a standard deviation.

One definition for the loss-spike watch, the first-mover baselines and the loss history's noise
band, so that "N robust deviations" means the same everywhere.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MAD_TO_SIGMA", "mad_sigma"]

#: 1.4826 * MAD estimates the standard deviation of normal data.
MAD_TO_SIGMA = 1.4826


def mad_sigma(values: np.ndarray, center: float) -> float:
    """``1.4826 * median(|values - center|)``: a standard deviation that outliers do not move."""
    return float(np.median(np.abs(values - center))) * MAD_TO_SIGMA
