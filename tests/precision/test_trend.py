"""The overflow prediction: a log-linear fit of amax over unevenly spaced sampled steps."""

from __future__ import annotations

import math
import random

import pytest

from torch_sentinel._collect.cadence import sampled
from torch_sentinel.precision.trend import AmaxTrend, predict_crossing

SAMPLED = [s for s in range(400) if sampled(s)]


def test_exact_exponential_growth_over_uneven_steps_gives_the_exact_step_and_no_error() -> None:
    trend = AmaxTrend(window=6)
    for s in [s for s in SAMPLED if s <= 100]:  # 0..9, then 10, 20, ..., 100
        trend.add(s, 3.0 * 1.1**s)
    crossing = trend.crossing(65520.0)
    assert crossing is not None
    assert crossing.step == pytest.approx(math.log(65520.0 / 3.0) / math.log(1.1), abs=1e-9)
    assert crossing.error == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("values", [[5.0] * 8, [8.0, 7.0, 6.5, 6.0, 5.0, 4.0], [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]],
                         ids=["flat", "shrinking", "zeros"])
def test_no_prediction_without_growth(values: list[float]) -> None:
    trend = AmaxTrend()
    for s, v in zip(SAMPLED, values):
        trend.add(s, v)
    assert trend.crossing(448.0) is None


def test_noise_around_a_flat_level_predicts_nothing_that_would_be_reported() -> None:
    rng = random.Random(0)
    predicted = reported = 0
    for _ in range(500):
        steps = [100 + 50 * i for i in range(6)]
        values = [10.0 * math.exp(rng.gauss(0, 0.2)) for _ in steps]
        crossing = predict_crossing(steps, [math.log2(v) for v in values], math.log2(448.0))
        predicted += crossing is not None
        # what precision_overflow needs: within 100 steps, to within one step
        reported += crossing is not None and crossing.step - steps[-1] <= 100 and crossing.error <= 1
    # a one-sided t-test at 3 standard errors with 4 degrees of freedom passes 2% of pure noise
    assert predicted <= 0.04 * 500
    assert reported == 0


def test_too_few_samples_or_too_short_a_span_predicts_nothing() -> None:
    assert predict_crossing([0, 1, 2], [0.0, 1.0, 2.0], 10.0) is None
    assert predict_crossing([0, 1, 2, 3], [0.0, 1.0, 2.0, 3.0], 10.0) is None  # span 3 < 5
    assert predict_crossing([0, 1, 2, 3, 5], [0.0, 1.0, 2.0, 3.0, 5.0], 10.0) is not None


def test_the_error_shrinks_as_samples_accumulate() -> None:
    rng = random.Random(1)
    errors = []
    for n in (6, 12, 24):
        steps = list(range(0, 10 * n, 10))
        values = [s * 0.1375 + rng.gauss(0, 0.1) for s in steps]
        crossing = predict_crossing(steps, values, 16.0)
        assert crossing is not None
        errors.append(crossing.error)
    assert errors[0] > errors[1] > errors[2]


def test_steps_that_go_back_start_the_series_again() -> None:
    trend = AmaxTrend()
    for s in range(6):
        trend.add(s, 2.0**s)
    trend.add(0, 1.0)  # a resumed run renumbered from 0
    assert list(trend.samples) == [(0, 0.0)]


def test_amax_samples_extend_the_trend_without_rows() -> None:
    """Steps 3-9 are amax samples (``probe.histogram_step``): no rows, but their points are in
    the fit, so the row at step 10 fits the last eight samples (3..10), not 0, 1, 2 and 10."""
    import numpy as np

    from torch_sentinel.precision.layout import BinLayout
    from torch_sentinel.precision.monitor import PrecisionMonitor, Sample, TensorRow
    from torch_sentinel.precision.probe import histogram_step

    layout = BinLayout.default()
    assert [s for s in range(25) if sampled(s) and histogram_step(s)] == [0, 1, 2, 10, 20]

    def sample(step: int, full: bool) -> Sample:
        amax = np.float32(3.0 * 1.1**step)
        counts = np.zeros((1, layout.bins), dtype=np.int64)
        if full:
            counts[0, layout.position(f"binade:{math.floor(math.log2(amax))}") + 1] = 1
        return Sample(step, counts, np.array([amax]).view(np.int32).astype(np.int64), False, full)

    rows = {}
    for with_amax_samples in (True, False):
        monitor = PrecisionMonitor(layout, [TensorRow("0", "activation")])
        out = []
        for step in range(11):
            if histogram_step(step) or with_amax_samples:
                out.append(monitor.derive(sample(step, histogram_step(step)), ("fp16",), None))
        assert [len(r) for r in out if r] == [1, 1, 1, 1] and sum(not r for r in out) == (7 if with_amax_samples else 0)
        rows[with_amax_samples] = out[-1][0]
    assert rows[True].trend_span == 7 and rows[False].trend_span == 10
    overflow = math.log(65520.0 / 3.0) / math.log(1.1)
    assert rows[True].predicted_overflow_step == pytest.approx(math.ceil(overflow), abs=1)
