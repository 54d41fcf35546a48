"""attach() / Sentinel: argument checking, lifecycle, and leaving what the user owns untouched."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from helpers import MLP, MODELS, train
from torch import nn
from userscript import events

import torch_sentinel


def _opt(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


@pytest.mark.parametrize(
    ("model", "optimizer", "error", "match"),
    [
        (lambda: "not a model", lambda m: None, TypeError, r"expected an nn\.Module.*\n.*arrived:\s+builtins\.str"),
        (MLP, lambda m: torch.optim.SGD, TypeError, r"expected a torch\.optim\.Optimizer.*\n.*arrived:\s+type"),
        (MLP, lambda m: [_opt(m), "x"], TypeError, r"a sequence containing SGD, str"),
        (MLP, lambda m: m.state_dict(), TypeError, r"not its class, a scheduler, or its state_dict"),
    ],
    ids=["model-not-module", "optimizer-class", "optimizer-list-with-str", "optimizer-state-dict"],
)
def test_attach_rejects_bad_objects(model, optimizer, error, match) -> None:
    m = model()
    with pytest.raises(error, match=match):
        torch_sentinel.attach(m, optimizer(m))


def test_attaching_again_after_surgery_replaces_the_sentinel_and_watches_the_new_layer(tmp_path) -> None:
    """The README's "Replacing a submodule after attach()": attach again to watch everything."""
    torch.manual_seed(0)
    m = MLP()
    opt = _opt(m)
    first = torch_sentinel.attach(m, opt, log_dir=str(tmp_path), flush_every=5)
    train(m, opt, "mlp", 5, corrupt=lambda step, x: x * 40)  # unnormalized inputs: a finding
    found = [f.kind for f in first.findings]
    assert "unnormalized_input" in found
    m.head = nn.Linear(32, 4)  # surgery, and an optimizer for the new parameters
    opt = _opt(m)
    second = torch_sentinel.attach(m, opt, log_dir=str(tmp_path))
    assert not first.attached and second.attached
    assert second.step == 5  # the run goes on
    assert [f.kind for f in first.report().findings] == found  # the old report still answers
    train(m, opt, "mlp", 5, corrupt=lambda step, x: x * 40, seed=1)
    second.detach()
    # the new head's parameters are watched: their gradient norms are in the rows
    assert all(r.mapping("grad_norm")["head.weight"] > 0 for r in second.recent_records())
    # findings carry over, not reported twice; every step is in TensorBoard once
    assert [f.kind for f in second.findings].count("unnormalized_input") == 1
    lines = (tmp_path / "findings.jsonl").read_text().splitlines()
    assert sum('"unnormalized_input"' in line for line in lines) == 1
    assert [e.step for e in events(tmp_path).Scalars("loss/train")] == list(range(10))


def test_attaching_again_with_bad_options_leaves_the_first_sentinel_attached() -> None:
    m = MLP()
    opt = _opt(m)
    with torch_sentinel.attach(m, opt) as s:
        with pytest.raises(torch_sentinel.OptionError):
            torch_sentinel.attach(m, opt, flush_every=0)
        assert s.attached


def test_optimizer_without_model_parameters_warns() -> None:
    m = MLP()
    other = _opt(MLP())
    with pytest.warns(UserWarning, match=r"holds none of the model's parameters"):
        torch_sentinel.attach(m, other).detach()


def _hook_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    state = {}
    for name, mod in model.named_modules():
        state[name] = (
            dict(mod._forward_hooks), dict(mod._forward_pre_hooks), dict(mod._backward_hooks),
            dict(getattr(mod, "_forward_hooks_always_called", {})),
        )
    state["opt"] = (dict(opt._optimizer_step_pre_hooks), dict(opt._optimizer_step_post_hooks))
    return state


def test_detach_restores_model_optimizer_and_patches_exactly() -> None:
    torch.manual_seed(0)
    m = MLP()
    opt = _opt(m)
    before = _hook_state(m, opt)
    backward = torch.autograd.backward
    scale = torch.amp.GradScaler.__dict__["scale"]
    step = torch.amp.GradScaler.__dict__["step"]
    relu = nn.functional.relu
    s = torch_sentinel.attach(m, opt)
    assert torch.autograd.backward is not backward
    train(m, opt, "mlp", 3)
    s.detach()
    s.detach()  # idempotent
    assert _hook_state(m, opt) == before
    assert torch.autograd.backward is backward
    assert torch.amp.GradScaler.__dict__["scale"] is scale
    assert torch.amp.GradScaler.__dict__["step"] is step
    assert nn.functional.relu is relu


@pytest.mark.parametrize("kind", ["mlp", "cnn", "transformer"], ids=["mlp", "cnn", "transformer"])
def test_training_is_bit_identical_with_and_without_the_sentinel(kind: str) -> None:
    def run(attach: bool):
        torch.manual_seed(0)
        model = MODELS[kind]()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        s = torch_sentinel.attach(model, opt) if attach else None
        losses = train(model, opt, kind, 6)
        if s is not None:
            s.detach()
        return losses, copy.deepcopy(model.state_dict()), opt.state_dict()

    bare_losses, bare_state, bare_opt = run(False)
    losses, state, opt_state = run(True)
    assert losses == bare_losses
    assert state.keys() == bare_state.keys()
    for k in state:
        assert torch.equal(state[k], bare_state[k]), k
    assert opt_state["param_groups"] == bare_opt["param_groups"]
    assert opt_state["state"].keys() == bare_opt["state"].keys()


def test_context_manager_detaches_and_report_survives() -> None:
    m = MLP()
    opt = _opt(m)
    with torch_sentinel.attach(m, opt) as s:
        train(m, opt, "mlp", 3)
    assert not s.attached
    assert not m.fc1._forward_hooks
    report = s.report()
    assert report.steps == 3
    assert report.ok, str(report)
    assert report.next_check == "continue_training_or_collect_more_evidence"


def test_step_counts_optimizer_steps_and_is_zero_based() -> None:
    m = MLP()
    opt = _opt(m)
    with torch_sentinel.attach(m, opt) as s:
        assert s.step == 0
        train(m, opt, "mlp", 4)
        assert s.step == 4


def test_public_api_is_explicit() -> None:
    assert "attach" in torch_sentinel.__all__
    for name in torch_sentinel.__all__:
        assert hasattr(torch_sentinel, name), name
    assert torch_sentinel.BOUNDARIES == ("data", "shapes", "forward", "loss", "gradients", "updates", "curves")
    assert issubclass(torch_sentinel.NonFiniteError, torch_sentinel.SentinelError)
    assert issubclass(torch_sentinel.SentinelError, RuntimeError)


def test_forward_only_attach_without_optimizer_is_quiet() -> None:
    m = MLP()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch_sentinel.attach(m) as s:
            with torch.no_grad():
                m(torch.randn(4, 20))
            m(torch.randn(4, 20)).sum().backward()
    assert s.report().ok


@pytest.mark.parametrize("as_tensor", [False, True], ids=["float", "tensor"])
def test_validation_after_the_last_step_reaches_the_report(as_tensor: bool) -> None:
    # Regression: a validation loss observed after the final optimizer step used to be lost,
    # because its row never closed.
    torch.manual_seed(0)
    model = MLP()
    opt = _opt(model)
    with torch_sentinel.attach(model, opt) as s:
        train(model, opt, "mlp", 3)
        s.observe_validation(torch.tensor(0.75) if as_tensor else 0.75)
    validations = [r.validation for r in s.recent_records() if r.validation is not None]
    assert validations == [0.75]
    assert s.recent_records()[-1].step == 3 and s.recent_records()[-1].loss is None
    assert s.report().ok
