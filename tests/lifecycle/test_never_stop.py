"""Never the reason training stops: what a probe cannot read is skipped with ONE warning that
says what is not watched, and training runs exactly as without the sentinel."""

from __future__ import annotations

import copy
import io
import pickle
import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn

import torch_sentinel


def _sentinel_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if str(w.message).startswith("torch_sentinel")]


def _steps(model: nn.Module, opt: torch.optim.Optimizer, batch: Callable[[], Any],
           loss_of: Callable[[Any], torch.Tensor], n: int = 4) -> list[float]:
    losses = []
    for _ in range(n):
        opt.zero_grad()
        loss = loss_of(model(batch()))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


class Nested(nn.Module):
    """Returns a nested tensor (ragged sequences), as a packing layer would."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nested.as_nested_tensor([self.lin(x[:1]), self.lin(x[1:])])


class Spectrum(nn.Module):
    """Complex and integer outputs next to a float one."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.fft.rfft(x), x.argmax(-1)


def _nested_sum(out: torch.Tensor) -> torch.Tensor:
    return torch.stack([t.sum() for t in out.unbind()]).sum()


CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[], Any], Callable[[Any], torch.Tensor], list[str]]] = {
    # nn.Embedding(sparse=True): _foreach_norm refuses sparse gradients; their norm is read from
    # the coalesced values instead, so nothing is lost and nothing is said.
    "sparse-embedding": (
        lambda: nn.Sequential(nn.Embedding(10, 4, sparse=True), nn.Linear(4, 2)),
        lambda: torch.randint(0, 10, (6,)), lambda out: out.pow(2).mean(), [],
    ),
    # A lazy module has no parameter shapes until its first forward: attach() must not touch them.
    "lazy": (
        lambda: nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.Linear(8, 2)),
        lambda: torch.randn(5, 3), lambda out: out.pow(2).mean(), [],
    ),
    "nested": (lambda: nn.Sequential(Nested()), lambda: torch.randn(3, 4), _nested_sum,
               ["outputs that are nested tensors are not watched"]),
    "complex-and-integer": (
        lambda: nn.Sequential(nn.Linear(8, 8), Spectrum()),
        lambda: torch.randn(3, 8), lambda out: out[0].abs().mean(),
        ["outputs that are complex tensors are not watched"],
    ),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_unsupported_evidence_is_skipped_with_one_warning_and_training_is_unchanged(case: str) -> None:
    make, batch, loss_of, expected = CASES[case]
    # The momentum-free SGD used here accepts sparse gradients.
    torch.manual_seed(0)
    plain = make()
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    torch.manual_seed(1)
    plain_losses = _steps(plain, plain_opt, batch, loss_of)
    torch.manual_seed(0)
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch_sentinel.attach(model, opt, check="immediate") as s:
            losses = _steps(model, opt, batch, loss_of)
            report = s.report()
    assert losses == plain_losses
    said = _sentinel_warnings(caught)
    assert len(said) == len(expected), said
    for text, message in zip(expected, said):
        assert text in message
    assert not [f for f in report.findings if f.kind in ("non_finite", "no_gradient", "no_update")]
    assert s.step == 4


def test_sparse_gradient_norms_are_recorded(tmp_path) -> None:
    model = nn.Sequential(nn.Embedding(10, 4, sparse=True), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_sentinel.attach(model, opt, log_dir=str(tmp_path)):
        x = torch.tensor([1, 1, 3])
        opt.zero_grad()
        model(x).sum().backward()
        want = model[0].weight.grad.to_dense().norm().item()
        opt.step()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert acc.Scalars("grad_norm/0")[0].value == pytest.approx(want, rel=1e-5)


def test_torch_func_transforms_are_skipped_with_one_warning() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(5, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch_sentinel.attach(model, opt, check="immediate") as s:
            for _ in range(3):
                params = {k: v.detach() for k, v in model.named_parameters()}

                def loss(p: dict[str, torch.Tensor], xi: torch.Tensor) -> torch.Tensor:
                    return torch.func.functional_call(model, p, (xi[None],)).sum()

                grads = torch.func.grad(lambda p: torch.func.functional_call(model, p, (x,)).sum())(params)
                per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x)
                assert grads["0.weight"].shape == per_sample["0.weight"].shape[1:]
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
            report = s.report()
    said = _sentinel_warnings(caught)
    assert len(said) == 1 and "inside torch.func transforms" in said[0] and "are not watched" in said[0]
    assert s.step == 3
    assert not [f for f in report.findings if f.kind == "non_finite"]


@pytest.mark.parametrize("how", ["deepcopy", "averaged-model", "torch-save", "pickle"],
                         ids=["deepcopy", "averaged-model", "torch-save", "pickle"])
def test_copies_of_an_attached_model_work_and_are_not_instrumented(how: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 4)
    with torch_sentinel.attach(model, opt, check="immediate") as s:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        if how == "deepcopy":
            copy_ = copy.deepcopy(model)
        elif how == "averaged-model":
            averaged = torch.optim.swa_utils.AveragedModel(model)
            averaged.update_parameters(model)
            copy_ = averaged.module
        elif how == "torch-save":
            buf = io.BytesIO()
            torch.save(model, buf)
            buf.seek(0)
            copy_ = torch.load(buf, weights_only=False)
        else:
            copy_ = pickle.loads(pickle.dumps(model))
        # The copy computes what the model computes, and feeds nothing to the sentinel: a NaN
        # through the copy's forward (immediate mode would raise in an instrumented hook) is
        # not the model's fault.
        with torch.no_grad():
            assert torch.equal(copy_(x), model(x))
        bad = x.clone()
        bad[0, 0] = float("nan")
        assert copy_(bad).isnan().any()
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        assert s.step == 2
    assert not [f for f in s.findings if f.kind == "non_finite"]
