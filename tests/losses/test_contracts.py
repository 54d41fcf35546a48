"""The loss table: every loss torch ships has an entry, and every entry names what torch ships.

Enumerated from torch itself, so a loss added in a later torch release fails here until it is
given a contract (``torch_sentinel/losses/contracts.py``).
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from torch_sentinel.losses import CLAUSES, CONTRACTS, by_function, by_module
from torch_sentinel.losses.checks import INPUT_CHECKS, TARGET_CHECKS, layout


def torch_loss_modules() -> list[str]:
    """Every public ``nn.Module`` subclass in ``torch.nn`` whose name ends in ``Loss``."""
    return sorted(name for name, obj in vars(nn).items()
                  if not name.startswith("_") and name.endswith("Loss") and inspect.isclass(obj)
                  and issubclass(obj, nn.Module))


def torch_loss_functions() -> list[str]:
    """Every public function of ``torch.nn.functional`` that is a loss: ``*_loss``, the
    cross-entropies and ``kl_div``."""
    return sorted(name for name, obj in vars(F).items()
                  if not name.startswith("_") and callable(obj)
                  and (name.endswith("_loss") or "cross_entropy" in name or name == "kl_div"))


def test_the_enumeration_finds_the_known_losses() -> None:
    assert {"CrossEntropyLoss", "NLLLoss", "CTCLoss", "TripletMarginWithDistanceLoss",
            "AdaptiveLogSoftmaxWithLoss"} <= set(torch_loss_modules())
    assert {"cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "ctc_loss"} <= set(torch_loss_functions())


@pytest.mark.parametrize("name", torch_loss_modules())
def test_every_loss_module_has_a_contract(name: str) -> None:
    contract = by_module(name)
    assert contract is not None, f"nn.{name} has no entry in torch_sentinel/losses/contracts.py"
    if contract.functional:
        assert hasattr(F, contract.name)


@pytest.mark.parametrize("name", torch_loss_functions())
def test_every_loss_function_has_a_contract(name: str) -> None:
    assert by_function(name) is not None, f"F.{name} has no entry in torch_sentinel/losses/contracts.py"


@pytest.mark.parametrize("contract", CONTRACTS, ids=[c.name for c in CONTRACTS])
def test_every_entry_is_complete_and_names_real_torch_objects(contract) -> None:  # type: ignore[no-untyped-def]
    for module in contract.modules:
        assert inspect.isclass(getattr(nn, module, None)), module
    if contract.functional:
        params = inspect.signature(getattr(F, contract.name)).parameters
        assert all(name in params for name in contract.inputs), (contract.inputs, list(params))
    assert contract.input and contract.target and contract.shape and contract.reductions
    assert set(contract.clauses) <= set(CLAUSES)
    # a clause read from figures has a device check behind it
    figure_clauses = set(contract.clauses) - {"loss_broadcast", "class_dim"}
    if figure_clauses:
        assert contract.name in INPUT_CHECKS or contract.name in TARGET_CHECKS
        assert layout(contract)


def test_the_stable_kinds_are_clauses_of_the_table() -> None:
    assert CLAUSES["probabilities_as_logits"] == "probabilities_as_logits"
    assert CLAUSES["loss_broadcast"] == "loss_broadcast"
    assert set(CLAUSES.values()) == {"probabilities_as_logits", "loss_broadcast", "invalid_loss_input",
                                     "invalid_target"}


def test_torch_still_refuses_what_the_table_leaves_to_it() -> None:
    """The clauses left to torch (``torch_checks``) are refused on CPU: if a torch release stops
    refusing one, it must become a clause."""
    x = torch.randn(4, 5)
    with pytest.raises((IndexError, RuntimeError)):
        F.nll_loss(x.log_softmax(1), torch.tensor([0, 1, 7, 2]))
    with pytest.raises(RuntimeError):
        F.binary_cross_entropy(torch.rand(4), torch.tensor([0.0, 255.0, 0.0, 1.0]))
    with pytest.raises(ValueError):
        F.gaussian_nll_loss(torch.randn(4), torch.randn(4), -torch.rand(4))
    with pytest.raises(RuntimeError):
        F.multi_margin_loss(x, torch.tensor([0, 1, 7, 2]))
