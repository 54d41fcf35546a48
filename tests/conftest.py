"""Shared fixtures. Model classes and the plain training loop live in tests/helpers.py."""

from __future__ import annotations

import os

import pytest
import torch

# Tests choose their policy and mode explicitly; an override in the environment would change them.
for _var in ("TORCH_SENTINEL_ON_NONFINITE", "TORCH_SENTINEL_CHECK"):
    os.environ.pop(_var, None)


@pytest.fixture(params=["mlp", "cnn", "transformer"], ids=["mlp", "cnn", "transformer"])
def model_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=["immediate", "deferred"], ids=["immediate", "deferred"])
def check_mode(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def one_torch_thread():
    """Tiny example programs on 2 shared cores: intra-op threads only thrash."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
