"""The forward probe's immediate localisation: names and types in messages belong together."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torch_sentinel
from torch_sentinel import NonFiniteError


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.log(torch.relu(self.fc(x))))  # log(0) = -inf in functional code


def test_a_functional_fault_in_the_models_forward_names_the_models_own_type() -> None:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_sentinel.attach(model, opt, check="immediate"), \
            pytest.raises(NonFiniteError, match=r"module '<model>' \(Net\)") as info:
        opt.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
    assert "(Linear)" not in str(info.value).splitlines()[0]
    assert info.value.evidence["first_nonfinite_output_of"] == "head"
    assert info.value.evidence["first_nonfinite_output_type"] == "Linear"
