"""A NaN made inside a torch.utils.checkpoint block is charged to the module inside the block,
with use_reentrant=True (whose forward runs under no_grad; the backward recomputes it with
grad) and use_reentrant=False, in both check modes."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import torch_sentinel


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.log = Log()
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.log(self.fc(x)))


class Net(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.block = Block()
        self.head = nn.Linear(8, 2)
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(checkpoint(self.block, self.inp(x), use_reentrant=self.reentrant))


@pytest.mark.parametrize("check", ["immediate", "deferred"], ids=["immediate", "deferred"])
@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_nan_inside_a_checkpointed_block_is_localised_inside_it(reentrant: bool, check: str) -> None:
    torch.manual_seed(0)
    model = Net(reentrant)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.no_grad():
        model.block.fc.bias.fill_(5.0)  # log of positive values: finite
    with torch_sentinel.attach(model, opt, check=check) as s, pytest.raises(torch_sentinel.NonFiniteError) as info:
        for step in range(4):
            if step == 2:
                with torch.no_grad():
                    model.block.fc.bias.fill_(-50.0)  # log of negative values: NaN inside the block
            opt.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
    assert (info.value.step, info.value.boundary, info.value.module) == (2, "forward", "block.log")
    if check == "immediate":
        assert s.step == 2  # raised inside the block's forward, before step 2's update


def test_healthy_checkpointed_training_is_bit_identical() -> None:
    def run(attach: bool) -> list[float]:
        torch.manual_seed(0)
        model = Net(reentrant=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        with torch.no_grad():
            model.block.fc.bias.fill_(20.0)
        g = torch.Generator().manual_seed(0)
        sentinel = torch_sentinel.attach(model, opt) if attach else None
        losses = []
        for _ in range(5):
            opt.zero_grad()
            loss = model(torch.randn(3, 4, generator=g)).pow(2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        if sentinel is not None:
            assert sentinel.report().ok
            sentinel.detach()
        return losses

    assert run(True) == run(False)
