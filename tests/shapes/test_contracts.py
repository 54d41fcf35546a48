"""Named-axis contracts: binding, messages that name the disagreeing axes, removal."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torch_sentinel
from torch_sentinel import ShapeContractError
from torch_sentinel.shapes import explain_broadcast, rank_hint


class DropLastRow(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:-1]


def test_module_contract_binds_and_passes() -> None:
    layer = nn.Linear(16, 4)
    with torch_sentinel.expect(layer, input="B F", output="B H", name="decoder"):
        assert layer(torch.randn(8, 16)).shape == (8, 4)


def test_module_contract_names_the_axis_that_disagrees() -> None:
    layer = nn.Linear(16, 4)
    handle = torch_sentinel.expect(layer, input=["B F"], output="B 5", name="decoder")
    with pytest.raises(ShapeContractError, match=r"decoder violated: output\[0\] dim 1 is 4, but the contract fixes it to 5"):
        layer(torch.randn(8, 16))
    handle.remove()
    assert layer(torch.randn(8, 16)).shape == (8, 4)  # removed: no contract any more


def test_batch_axis_must_agree_between_input_and_output() -> None:
    m = DropLastRow()
    torch_sentinel.expect(m, input="B F", output="B F", name="trim")
    with pytest.raises(ShapeContractError) as info:
        m(torch.randn(8, 3))
    msg = str(info.value)
    assert "axis B of output[0] is 7, but B = 8 from input[0] dim 0" in msg
    assert "axes that disagree: B (7 vs 8 bound by input[0] dim 0)" in msg
    assert "dimensions at position -2 compare as 8 (B from input[0] dim 0) and 7" in msg


def test_function_contract_explains_trailing_dimensions() -> None:
    @torch_sentinel.expect(a="B H", b="H")
    def add_bias(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b

    assert add_bias(torch.ones(32, 4), torch.ones(4)).shape == (32, 4)
    with pytest.raises(ShapeContractError, match=r"trailing dimensions compare as 4 \(H from a dim 1\) and 32 \(b\)"):
        add_bias(torch.ones(32, 4), torch.ones(32))


def test_function_contract_rank_error_suggests_the_reshape() -> None:
    @torch_sentinel.expect(pred="N", target="N", returns="")
    def mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((pred - target) ** 2).mean()

    with pytest.raises(ShapeContractError, match=r"target has rank 2, expected rank 1") as info:
        mse(torch.ones(5), torch.ones(5, 1))
    assert r"(5, 1) and (5,) hold the same values with different ranks; .squeeze(-1) gives (5,)" in str(info.value)


def test_ellipsis_keeps_leading_axes_free() -> None:
    layer = nn.Linear(6, 2)
    torch_sentinel.expect(layer, input="... F", output="... 2")
    assert layer(torch.randn(3, 4, 6)).shape == (3, 4, 2)
    assert layer(torch.randn(6)).shape == (2,)


def test_output_from_a_raising_forward_does_not_leak_bindings() -> None:
    layer = nn.Linear(4, 4)
    torch_sentinel.expect(layer, input="B F", output="B F")
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        layer(torch.randn(2, 3))
    assert layer(torch.randn(5, 4)).shape == (5, 4)  # B=5 is not checked against the failed B=2


@pytest.mark.parametrize(
    ("spec", "error"),
    [("B F F2 ... ...", ValueError), ("B F-1", ValueError), (3, TypeError)],
    ids=["two-ellipses", "bad-token", "not-a-str"],
)
def test_bad_specs_fail_at_expect_time(spec: object, error: type) -> None:
    with pytest.raises(error):
        torch_sentinel.expect(nn.Linear(2, 2), input=spec)  # type: ignore[arg-type]


def test_unknown_parameter_name_is_rejected() -> None:
    with pytest.raises(TypeError, match="not parameters of"):
        torch_sentinel.expect(y="B")(lambda x: x)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ((32, 4), (32,), "trailing dimensions compare as 4 and 32"),
        ((2, 3, 4), (5, 4), "dimensions at position -2 compare as 3 and 5"),
        ((32, 4), (4,), None),
        ((32, 4), (32, 1), None),
    ],
    ids=["row-vector", "second-from-right", "broadcasts", "column"],
)
def test_explain_broadcast(a: tuple[int, ...], b: tuple[int, ...], expected: str | None) -> None:
    text = explain_broadcast(a, b)
    if expected is None:
        assert text is None
    else:
        assert text is not None and expected in text


def test_explain_broadcast_suggests_the_row_reshape() -> None:
    assert ".reshape(32, 1) gives (32, 1)" in str(explain_broadcast((32, 4), (32,)))


@pytest.mark.parametrize(
    ("got", "want", "how"),
    [((5,), (5, 1), ".unsqueeze(-1)"), ((5, 1), (5,), ".squeeze(-1)"), ((1, 5), (5,), ".squeeze(0)")],
    ids=["add-column", "drop-column", "drop-row"],
)
def test_rank_hint(got: tuple[int, ...], want: tuple[int, ...], how: str) -> None:
    assert how in str(rank_hint(got, want))
    assert rank_hint((5,), (6, 1)) is None
