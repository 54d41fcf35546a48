"""The torch RNG copies per root forward, and their cost: one shared copy against one per consumer.

With ``log_dir`` set, three components need the torch RNG state at the entry of each training
forward: the collector's rerun (ordinary steps, immediate mode), the shape notes and the
incident recorder. They share ``Collector.forward_rng()``'s one copy. The "per consumer"
variant makes every ``forward_rng()`` call copy again, which is what the three did before
(each its own ``torch.get_rng_state()``). Both variants run in one process, interleaved in
blocks, on ordinary steps of a small model, timed in thread CPU time (a loaded machine
preempting the loop does not count); the figures are the median per forward of each
variant over the rounds, with its range, and the median of the paired differences (each round
runs both, in alternating order), which a loaded machine disturbs least.

    python -m benchmarks.rng_per_forward [--forwards 500] [--rounds 40]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from typing import Any

import torch
from torch import nn

import torch_sentinel
from torch_sentinel._collect.collector import Collector
from torch_sentinel._collect.rerun import capture_rng


def _per_consumer(self: Collector) -> Any:
    """Every caller copies (the behaviour before one copy was shared)."""
    return capture_rng(self.device)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--forwards", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=40)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.1), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(8, 16)
    shared = Collector.forward_rng
    calls = [0]
    real = torch.get_rng_state

    def counting() -> torch.Tensor:
        calls[0] += 1
        return real()

    with tempfile.TemporaryDirectory() as log_dir, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sentinel = torch_sentinel.attach(model, opt, check="immediate", log_dir=log_dir)
        for _ in range(120):  # past the sampled steps: ordinary steps from here on
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
        # Only forwards are timed: a training forward per iteration, no backward (the row stays
        # open; nothing else the sentinel does per forward differs between the variants).
        times: dict[str, list[float]] = {"shared": [], "per consumer": []}
        copies: dict[str, float] = {}
        torch.get_rng_state = counting  # type: ignore[assignment]
        try:
            for r in range(a.rounds):
                for name in (("shared", "per consumer") if r % 2 == 0 else ("per consumer", "shared")):
                    Collector.forward_rng = shared if name == "shared" else _per_consumer  # type: ignore[method-assign]
                    calls[0] = 0
                    t0 = time.thread_time()
                    for _ in range(a.forwards):
                        model(x)
                    times[name].append((time.thread_time() - t0) / a.forwards * 1e6)
                    copies[name] = calls[0] / a.forwards
        finally:
            Collector.forward_rng = shared  # type: ignore[method-assign]
            torch.get_rng_state = real
            sentinel.detach(quiet=True)
    t0 = time.thread_time()
    for _ in range(a.forwards):
        real()
    one = (time.thread_time() - t0) / a.forwards * 1e6
    print(f"{a.rounds} rounds x {a.forwards} forwards per variant, interleaved; torch {torch.__version__}")
    for name, ts in times.items():
        print(f"{name:>13}: {statistics.median(ts):7.1f} us per forward (range {min(ts):.1f}-{max(ts):.1f}), "
              f"{copies[name]:.0f} torch.get_rng_state per forward")
    diffs = sorted(p - s for p, s in zip(times["per consumer"], times["shared"]))
    q = len(diffs) // 4
    print(f"per consumer - shared, paired by round: median {statistics.median(diffs):.1f} us per forward "
          f"(middle half {diffs[q]:.1f} to {diffs[-q - 1]:.1f})")
    print(f"one torch.get_rng_state(): {one:.2f} us")


if __name__ == "__main__":
    main()
