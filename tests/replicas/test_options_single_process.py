"""Options of the replica check, and a single process: with no process group nothing runs."""

from __future__ import annotations

import pytest
import torch
from helpers import MLP, make_batch

import torch_sentinel
from torch_sentinel._replicas.plan import build_plan
from torch_sentinel.testing import count_host_syncs, count_launches


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"replica_check_every": -1}, r"replica_check_every is not valid\n  expected: an int >= 0"),
        ({"replica_check_every": "200"}, r"replica_check_every.*\n.*\n.*arrived:  '200' \(str\)"),
        ({"replica_check": "exct"}, r"replica_check='exct' is not valid(.|\n)*did you mean 'exact'\?"),
        ({"on_divergence": "record"}, r"on_divergence='record' is not valid\n  expected: one of 'raise', 'warn'"),
        ({"thresholds": {"replica_divergence.rtl": 1e-4}}, r"did you mean 'replica_divergence.rtol'\?"),
    ],
    ids=["negative", "string", "misspelt-mode", "record-policy", "misspelt-threshold"],
)
def test_bad_options_fail_at_attach(options: dict, match: str) -> None:
    with pytest.raises(torch_sentinel.OptionError, match=match):
        torch_sentinel.attach(MLP(), **options)


def _launches_per_step(every: int) -> list[int]:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    counts = []
    with torch_sentinel.attach(model, opt, check="deferred", flush_every=1000, replica_check_every=every):
        for step in range(4):
            x, y = make_batch("mlp", generator=torch.Generator().manual_seed(step))
            with count_launches() as launches, count_host_syncs() as syncs:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
            assert syncs.count == 0
            counts.append(launches.count)
    return counts


def test_without_a_process_group_nothing_runs() -> None:
    assert not torch.distributed.is_initialized()
    assert build_plan(MLP(), MLP(), 1) is None
    # Asked to check at every step, a single process does not add one device op.
    assert _launches_per_step(1) == _launches_per_step(0)


def test_disabling_the_kind_or_every_zero_is_accepted() -> None:
    with torch_sentinel.attach(MLP(), disable={"replica_divergence"}, replica_check_every=0) as s:
        assert s.options.replica_check_every == 0
