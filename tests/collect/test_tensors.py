"""``reducible``: which outputs and gradients the batched checks fold into a slot."""

from __future__ import annotations

import pytest
import torch

from torch_sentinel._collect.tensors import reducible

CASES = {
    "float32": lambda: torch.randn(3),
    "float64": lambda: torch.randn(3, dtype=torch.float64),
    "bfloat16": lambda: torch.randn(3, dtype=torch.bfloat16),
    "float8": lambda: torch.randn(3).to(torch.float8_e4m3fn),
    "transposed": lambda: torch.randn(2, 3).t(),
    "empty": lambda: torch.randn(0),
    "int": lambda: torch.arange(3),
    "bool": lambda: torch.ones(3, dtype=torch.bool),
    "complex": lambda: torch.randn(3, dtype=torch.complex64),
    "meta": lambda: torch.empty(3, device="meta"),
    "sparse_coo": lambda: torch.randn(3, 3).to_sparse(),
    "sparse_csr": lambda: torch.randn(3, 3).to_sparse_csr(),
    "nested": lambda: torch.nested.nested_tensor([torch.randn(2), torch.randn(3)]),
    "jagged": lambda: torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)], layout=torch.jagged),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_reducible_is_dense_floating_and_non_empty(case: str) -> None:
    t = CASES[case]()
    expected = t.is_floating_point() and not t.is_meta and not t.is_sparse and not t.is_nested and t.numel() > 0
    assert reducible(t) == expected
