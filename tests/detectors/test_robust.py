"""The one robust spread the spike watch, the first-mover baselines and the noise band share."""

from __future__ import annotations

import numpy as np
import pytest

from torch_sentinel.detectors._robust import mad_sigma


def test_mad_sigma_estimates_a_normal_standard_deviation() -> None:
    x = np.random.default_rng(0).normal(0.0, 2.0, 100_000)
    assert mad_sigma(x, float(np.median(x))) == pytest.approx(2.0, rel=0.02)


def test_mad_sigma_is_not_moved_by_an_outlier() -> None:
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    spiked = np.array([1.0, 2.0, 3.0, 4.0, 1e9])
    assert mad_sigma(spiked, 3.0) == mad_sigma(x, 3.0) == pytest.approx(1.4826)
