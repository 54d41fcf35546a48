"""One ladder: the host localisation and the cross-rank priorities read the same table.

The same synthetic rows go to both; both must name the same rung, key and module.
"""

from __future__ import annotations

import math
from typing import Optional

import pytest
import torch
from torch import nn

from torch_sentinel._collect.collector import Collector
from torch_sentinel._collect.rungs import LADDER
from torch_sentinel._distributed import Priorities
from torch_sentinel._record import StepMeta, StepRecord
from torch_sentinel._record.fault import Fault
from torch_sentinel.detectors.base import RunContext
from torch_sentinel.detectors.nonfinite import locate


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, 4)
        self.act = nn.Tanh()
        self.fc2 = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def _setup() -> tuple[Collector, RunContext]:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c = Collector(model, [opt], immediate=False, update_every=0, on_record=lambda r: None)
    c.install()
    model(torch.randn(2, 3)).sum().backward()  # learns the forward order
    opt.step()
    c.close()
    ctx = RunContext(
        module_names=c.module_names, module_types={n: type(m).__name__ for n, m in c.map.modules},
        param_names=[n for n, _ in c.params], param_owner=dict(c.map.param_owner),
        optimizer_params={n for n, _ in c.params}, forward_order=c.forward_order,
    )
    return c, ctx


def _host(c: Collector, ctx: RunContext, values: torch.Tensor, meta: StepMeta) -> Optional[tuple[str, Optional[str]]]:
    fault = locate(StepRecord(meta, values.numpy(), c.ledger.blocks), ctx, c.ledger.width)
    return None if fault is None else (fault.boundary, fault.module)


def _device(c: Collector, ctx: RunContext, values: torch.Tensor, meta: StepMeta) -> Optional[tuple[str, Optional[str]]]:
    prio = Priorities(c.ledger, c.forward_order, c.ledger.width, exact_norms=ctx.exact_norms)
    level = int(prio.first_level(values, meta).item())
    if level >= prio.none:
        return None
    rung = prio.rungs[level]
    before = prio.rungs[level - 1] if level else None
    previous = before.index if before is not None and before.spec is rung.spec else None
    fault = Fault.at_rung(rung.spec.kind, meta.step, rung.index, rung.key, c.module_names, ctx.owner, previous=previous)
    return fault.boundary, fault.module


# (block, key, value, meta flags, exact norms): one bad slot per case, every rung covered.
CASES = [
    ("param_norm", "fc1.weight", math.nan, {"weights_recorded": True}, True),
    ("data.max", "inputs", math.inf, {}, True),
    ("data.min", "aux", -math.inf, {}, True),  # an attention mask: not a fault
    ("data.min", "aux", math.nan, {}, True),
    ("act.max", "fc2", math.nan, {}, True),
    ("act.min", "fc1", -math.inf, {}, True),
    ("loss", "auto", math.nan, {}, True),
    ("loss", "auto", math.nan, {"loss_explicit": True}, True),  # the explicit loss is judged instead
    ("loss", "explicit", math.inf, {"loss_explicit": True}, True),
    ("outgrad.max", "fc1", math.inf, {}, True),
    ("outgrad.max", "fc1", math.inf, {"amp": True}, True),  # the GradScaler judges gradients
    ("grad_norm", "fc2.bias", math.nan, {}, True),
    ("grad_norm", "fc2.bias", math.inf, {}, True),
    ("grad_norm", "fc2.bias", math.inf, {}, False),  # float32 overflow of finite values
    ("misc", "stale_grad_norm", math.inf, {}, True),
    ("update_norm", "fc1.bias", math.inf, {}, True),
    ("update_norm", "fc1.bias", math.inf, {}, False),
    ("update_norm", "fc1.bias", math.nan, {}, False),
]


@pytest.mark.parametrize("block,key,value,flags,exact", CASES,
                         ids=[f"{b}-{k}-{v}-{'-'.join(f) or 'plain'}-{'exact' if e else 'inexact'}"
                              for b, k, v, f, e in CASES])
def test_host_and_device_name_the_same_rung(block: str, key: str, value: float, flags: dict, exact: bool) -> None:
    c, ctx = _setup()
    ctx.exact_norms = exact
    values = c.ledger.current.clone()
    values[c.ledger.block(block).index(key)] = value
    meta = StepMeta(step=3, **flags)
    assert _host(c, ctx, values, meta) == _device(c, ctx, values, meta)


def test_the_earliest_rung_wins_on_both_sides() -> None:
    c, ctx = _setup()
    values = c.ledger.current.clone()
    for block, key in (("update_norm", "fc1.weight"), ("grad_norm", "fc1.weight"), ("act.max", "fc2"),
                       ("act.max", "fc1")):
        values[c.ledger.block(block).index(key)] = math.nan
    meta = StepMeta(step=1)
    assert _host(c, ctx, values, meta) == _device(c, ctx, values, meta) == ("forward", "fc1")


def test_the_table_reads_every_core_block() -> None:
    c, _ = _setup()
    read = {b for spec in LADDER for b in spec.blocks}
    assert set(c.ledger.blocks) <= read  # a bare collector's blocks are the core row
