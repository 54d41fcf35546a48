"""``attach(precision=...)`` is validated at attach: formats by name, alias or dtype."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torch_sentinel
from torch_sentinel import OptionError


@pytest.mark.parametrize(("value", "expected"), [
    (("bf16", "fp16", "e4m3", "e5m2"), ("bf16", "fp16", "e4m3", "e5m2")),
    (["bfloat16", "float8_e4m3fn", "half", "fp16"], ("bf16", "e4m3", "fp16")),
    ((torch.float8_e5m2, torch.bfloat16), ("e5m2", "bf16")),
    ((), ()),
], ids=["names", "aliases", "dtypes", "off"])
def test_formats_are_named_once_each(value: object, expected: tuple[str, ...]) -> None:
    with torch_sentinel.attach(nn.Linear(2, 2), precision=value) as s:
        assert s.options.precision == expected


@pytest.mark.parametrize(("value", "match"), [
    (("fp16", "fp8"), r"unknown format 'fp8'(.|\n)*expected: formats: 'bf16', 'fp16', 'e4m3', 'e5m2'"),
    (("bf61",), r"did you mean 'bf16'"),
    ("fp16", r"wrap it in a tuple: precision=\('fp16',\)"),
    (torch.float16, r"wrap it in a tuple"),
    ((torch.float32,), r"unknown format torch.float32"),
    (16, r"a tuple \(or list\) of formats"),
], ids=["unknown", "misspelt", "bare-string", "bare-dtype", "float32", "not-a-tuple"])
def test_a_bad_value_fails_at_attach_naming_the_valid_formats(value: object, match: str) -> None:
    with pytest.raises(OptionError, match=match):
        torch_sentinel.attach(nn.Linear(2, 2), precision=value)
