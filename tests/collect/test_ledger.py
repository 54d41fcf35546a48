"""The ledger (the step's row of device slots) and the host ring (rows on their way to the host)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torch_sentinel._collect.ledger import FLOAT_MAX, Ledger
from torch_sentinel._collect.transfer import HostRing


def test_blocks_are_contiguous_named_and_start_at_their_initial_values() -> None:
    ledger = Ledger(torch.device("cpu"), spare=2)
    loss = ledger.add_block("loss", ["auto", "explicit"])
    lo, hi = ledger.add_minmax_block("act", ["", "fc"])
    assert (loss.start, loss.stop, lo.start, hi.start, ledger.width) == (0, 2, 2, 4, 6)
    assert ledger.block("act.max").index("fc") == 5
    assert ledger.current.tolist()[: ledger.width] == [0.0, 0.0, FLOAT_MAX, FLOAT_MAX, -FLOAT_MAX, -FLOAT_MAX]
    with pytest.raises(KeyError, match="already exists"):
        ledger.add_block("loss", ["x"])


def test_views_write_into_the_row_and_reset_restores_it_with_one_copy() -> None:
    ledger = Ledger(torch.device("cpu"))
    block = ledger.add_block("grad_norm", ["a", "b"])
    ledger.views[block.start + 1].add_(torch.tensor(2.5))
    assert ledger.host_view is not None and ledger.host_view[block.start + 1] == 2.5
    ledger.reset()
    assert ledger.current.tolist()[: ledger.width] == [0.0, 0.0]


def test_a_block_added_late_grows_the_row_and_keeps_what_was_written() -> None:
    ledger = Ledger(torch.device("cpu"), spare=0)
    first = ledger.add_block("loss", ["auto"])
    ledger.views[first.start].fill_(3.0)
    generation = ledger.generation
    late = ledger.add_block("late", ["x", "y"], initial=7.0)
    assert ledger.generation == generation + 1
    assert ledger.current.tolist() == [3.0, 7.0, 7.0]
    assert ledger.initial_row().tolist() == [0.0, 7.0, 7.0]
    assert late.keys == ["x", "y"]


def test_the_host_ring_hands_rows_over_in_order_with_their_meta() -> None:
    ring = HostRing(torch.device("cpu"), width=3, rows=4)
    row = torch.zeros(3)
    for step in range(3):
        row.fill_(float(step))
        ring.push(row, {"step": step})
    assert ring.pending() == 3
    out = list(ring.drain())
    assert [m["step"] for m, _ in out] == [0, 1, 2]
    assert [v.tolist() for _, v in out] == [[0.0] * 3, [1.0] * 3, [2.0] * 3]
    assert ring.pending() == 0 and list(ring.drain()) == []


def test_host_ring_rows_are_copies_that_later_pushes_do_not_change() -> None:
    ring = HostRing(torch.device("cpu"), width=2, rows=2)
    kept = []
    for step in range(6):  # wraps around the ring three times, drained as it goes
        ring.push(torch.full((2,), float(step)), step)
        kept.extend(ring.drain())
    assert [m for m, _ in kept] == list(range(6))
    assert np.array_equal(np.stack([v for _, v in kept])[:, 0], np.arange(6, dtype=np.float32))


def test_a_narrower_row_fills_only_its_prefix() -> None:
    ring = HostRing(torch.device("cpu"), width=4, rows=2)
    ring.push(torch.ones(2), "narrow")
    (meta, values), = list(ring.drain())
    assert meta == "narrow" and values[:2].tolist() == [1.0, 1.0]
