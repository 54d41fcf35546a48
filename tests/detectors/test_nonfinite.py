"""The first non-finite step: boundary, module, exact step, evidence, in both check modes."""

from __future__ import annotations

import math
import re
import warnings
from typing import Optional

import pytest
import torch
from helpers import CNN, MLP, MODELS, Transformer, make_batch, train
from torch import nn

import torch_sentinel
from torch_sentinel import NonFiniteError


def _caught(sentinel: torch_sentinel.Sentinel, loop) -> Optional[NonFiniteError]:
    """Run the user's loop with the sentinel attached and detach it; the NonFiniteError raised
    on the way (in a hook, at a step, or when detach flushed pending evidence), if any."""
    try:
        loop()
        sentinel.detach()
    except NonFiniteError as e:
        return e
    finally:
        sentinel.detach()
    return None


class SqrtAbs(nn.Module):
    """sqrt(|x|): finite forward everywhere, but d/dx at x == 0 is 0 * inf = NaN."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x.abs())


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


def _run(model: nn.Module, opt: torch.optim.Optimizer, kind: str, steps: int, check: str, corrupt=None,
         before_step=None, **kwargs) -> tuple[Optional[NonFiniteError], torch_sentinel.Sentinel]:
    s = torch_sentinel.attach(model, opt, check=check, **kwargs)
    g = torch.Generator().manual_seed(0)

    def loop() -> None:
        for step in range(steps):
            x, y = make_batch(kind, generator=g)
            if corrupt is not None:
                x = corrupt(step, x)
            if before_step is not None:
                before_step(step, model)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()

    return _caught(s, loop), s


def _nan_in_batch_at(step_to_corrupt: int):
    def corrupt(step: int, x: torch.Tensor) -> torch.Tensor:
        if step == step_to_corrupt:
            x = x.clone()
            x.view(-1)[3] = math.nan
        return x
    return corrupt


@pytest.mark.parametrize("kind", ["mlp", "cnn"], ids=["mlp", "cnn"])
def test_nan_in_the_batch_is_a_data_fault_not_the_first_layers(kind: str, check_mode: str) -> None:
    torch.manual_seed(0)
    model = MODELS[kind]()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    err, _ = _run(model, opt, kind, 6, check_mode, corrupt=_nan_in_batch_at(4))
    assert err is not None
    assert (err.step, err.boundary, err.module, err.kind) == (4, "data", None, "non_finite")
    assert err.shape == tuple(make_batch(kind)[0].shape)
    assert err.dtype == "float32"
    if check_mode == "immediate":
        assert (err.nan, err.posinf, err.neginf) == (1, 0, 0)
    with pytest.raises(NonFiniteError, match=r"step 4, boundary 'data'.*\n.*expected:\s+a batch of finite values"
                                           r"[\s\S]*next:\s+inspect the batch and its preprocessing"):
        raise err


def _overflow_output_at(model: nn.Module, module_path: str, step_at: int) -> list[int]:
    """Make ``module_path`` emit an Inf at step ``step_at``, as an overflowing op inside it would.

    The hook is registered before attach, so it runs before the sentinel's, which sees the
    replaced output; the module's weights stay finite."""
    calls = [0]

    def overflow(module: nn.Module, args: object, out: torch.Tensor) -> Optional[torch.Tensor]:
        calls[0] += 1
        if calls[0] - 1 != step_at:
            return None
        spike = torch.zeros_like(out)
        spike.view(-1)[0] = math.inf
        return out + spike  # a forward hook's return value replaces the module's output

    model.get_submodule(module_path).register_forward_hook(overflow)
    return calls


def _poison_weight(step_at: int, module_path: str):
    def before_step(step: int, model: nn.Module) -> None:
        if step == step_at:
            with torch.no_grad():
                model.get_submodule(module_path).weight.view(-1)[0] = math.inf
    return before_step


@pytest.mark.parametrize(
    ("kind", "module"),
    [("mlp", "fc2"), ("cnn", "features.3"), ("transformer", "encoder.layers.1.linear1")],
    ids=["mlp", "cnn", "transformer"],
)
def test_forward_fault_names_the_first_module_in_execution_order(kind: str, module: str, check_mode: str) -> None:
    torch.manual_seed(0)
    model = MODELS[kind]()
    model.eval() if kind == "transformer" else None  # no dropout: keep the forward deterministic
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    _overflow_output_at(model, module, 2)
    err, _ = _run(model, opt, kind, 5, check_mode)
    assert err is not None
    assert (err.step, err.boundary, err.module) == (2, "forward", module)
    assert module in str(err) and "next:" in str(err)


@pytest.mark.parametrize(
    ("kind", "module"),
    [("mlp", "fc2"), ("cnn", "features.3")],
    ids=["mlp", "cnn"],
)
def test_weights_found_non_finite_are_charged_to_the_previous_update(kind: str, module: str, check_mode: str) -> None:
    torch.manual_seed(0)
    model = MODELS[kind]()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    err, _ = _run(model, opt, kind, 5, check_mode, before_step=_poison_weight(2, module))
    assert err is not None
    assert (err.step, err.boundary, err.module) == (1, "updates", module)
    assert err.evidence["parameter"] == f"{module}.weight"
    assert re.search(r"code that changed them between steps", str(err))
    if check_mode == "immediate":
        # Step 1's update left the weight finite (the spike ring's last row says so): it was
        # written between the steps, and the error says which weight, first.
        assert err.evidence["likely_cause"] == "weights_changed"
        assert re.search(rf"weight '{re.escape(module)}\.weight' changed from norm [\d.e+-]+ after the "
                         r"optimizer's last step to inf", str(err))


def test_functional_fault_between_submodules_is_blamed_on_the_caller() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(8, 8)
            self.out = nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(torch.log(self.inner(x)))  # log of negative values: NaN

    model = nn.Sequential(nn.Linear(4, 8), Block())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    expected = (r"boundary 'forward', module '1'[\s\S]*whose inputs were already non-finite"
                r"[\s\S]*functional code in this module's forward")
    with torch_sentinel.attach(model, opt, check="immediate"), pytest.raises(NonFiniteError, match=expected) as info:
        model(torch.randn(16, 4)).sum().backward()
    assert info.value.module == "1"
    assert info.value.evidence["first_nonfinite_output_of"] == "1.out"


def test_nan_that_appears_only_in_backward_is_attributed_to_the_module_that_computed_it(check_mode: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 16), SqrtAbs(), nn.Linear(16, 4))

    def zero_a_unit(step: int, m: nn.Module) -> None:
        if step == 3:  # unit 0 of the Linear then outputs exactly 0, where sqrt(|x|) has no derivative
            with torch.no_grad():
                m[2].weight[0].zero_()
                m[2].bias[0].zero_()

    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # keep the zeroed unit at exactly 0
    s = torch_sentinel.attach(model, opt, check=check_mode)

    def loop() -> None:
        for step in range(6):
            zero_a_unit(step, model)
            opt.zero_grad()
            out = model(torch.randn(8, 10))
            assert torch.isfinite(out).all()  # the forward pass stays finite
            nn.functional.cross_entropy(out, torch.randint(0, 4, (8,))).backward()
            opt.step()

    err = _caught(s, loop)
    assert err is not None
    assert (err.step, err.boundary, err.module) == (3, "gradients", "3")
    assert err.evidence["incoming_to"] == "2"
    assert re.search(r"backward produced a non-finite gradient from a finite one", str(err))


def test_non_finite_loss_is_a_loss_fault(check_mode: str) -> None:
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    s = torch_sentinel.attach(model, opt, check=check_mode)

    def loop() -> None:
        for step in range(4):
            opt.zero_grad()
            probs = model(torch.randn(8, 20)).softmax(-1)
            if step == 2:
                probs = probs * 0  # log(0) = -inf
            loss = -torch.log(probs[:, 0]).mean()
            loss.backward()
            opt.step()

    err = _caught(s, loop)
    assert err is not None
    assert (err.step, err.boundary, err.module) == (2, "loss", None)
    assert "log_softmax" in str(err)


def _first_nonfinite_step_by_hand(lr: float, steps: int) -> tuple[int, str]:
    """Ground truth for the exploding-lr test: check every boundary by hand, with host reads."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(0)
    for step in range(steps):
        x, y = make_batch("mlp", generator=g)
        outs: list[torch.Tensor] = []

        def keep(module: nn.Module, args: object, out: torch.Tensor, outs: list = outs) -> None:
            outs.append(out.detach())

        handles = [m.register_forward_hook(keep) for m in model.modules()]
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        for h in handles:
            h.remove()
        if not all(torch.isfinite(o).all() for o in outs):
            return step, "forward"
        if not torch.isfinite(loss):
            return step, "loss"
        loss.backward()
        if not all(torch.isfinite(p.grad).all() for p in model.parameters()):
            return step, "gradients"
        opt.step()
        if not all(torch.isfinite(p).all() for p in model.parameters()):
            return step, "updates"
    raise AssertionError("never went non-finite")


def test_exploding_learning_rate_is_caught_at_the_exact_step(check_mode: str) -> None:
    lr = 3e4
    expected_step, expected_boundary = _first_nonfinite_step_by_hand(lr, 40)
    assert expected_step > 0  # the run is healthy at first
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    err, _ = _run(model, opt, "mlp", 40, check_mode, update_every=1)
    assert err is not None
    assert (err.step, err.boundary) == (expected_step, expected_boundary)
    assert "update/weight ratio at step" in str(err)
    assert err.evidence["update_ratio_before"]["step"] == expected_step - 1


@pytest.mark.parametrize("bad_step", [2, 13], ids=["weights-read-that-step", "weights-not-read-that-step"])
def test_non_finite_parameters_after_the_step_are_an_update_fault(check_mode: str, bad_step: int) -> None:
    # Immediate mode reads every weight only on some steps (13 is not one of them): the next
    # forward's hook must still charge the fault to the update that made it.
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def blow_up(step: int, m: nn.Module) -> None:
        if step == bad_step:
            opt.param_groups[0]["lr"] = math.inf

    err, _ = _run(model, opt, "mlp", bad_step + 3, check_mode, before_step=blow_up)
    assert err is not None
    assert (err.step, err.boundary) == (bad_step, "updates")
    assert err.module is not None and err.module.startswith(("fc1", "fc2", "head"))


@pytest.mark.parametrize("policy", ["warn", "record"], ids=["warn", "record"])
def test_warn_and_record_policies_keep_training_and_report_once(policy: str, check_mode: str) -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        err, s = _run(model, opt, "mlp", 6, check_mode, corrupt=_nan_in_batch_at(2), on_nonfinite=policy)
    assert err is None
    found = s.report().by_kind("non_finite")
    assert [(f.step, f.boundary) for f in found] == [(2, "data")]
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning) and "non-finite" in str(w.message)]
    assert len(runtime) == (1 if policy == "warn" else 0)
    report = s.report()
    assert report.boundary == "data" and not report.ok


def test_additive_masks_with_minus_inf_are_not_faults(check_mode: str) -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    mask = nn.Transformer.generate_square_subsequent_mask(6)
    assert torch.isinf(mask).any()
    with torch_sentinel.attach(model, opt, check=check_mode) as s:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 6, 16), mask=mask, is_causal=True).pow(2).mean().backward()
            opt.step()
    assert s.report().ok, str(s.report())


def test_hf_model_with_huge_negative_attention_masks_stays_quiet(check_mode: str) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32, num_labels=3)
    model = transformers.BertForSequenceClassification(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 60, (4, 10))
    attention = torch.ones(4, 10, dtype=torch.long)
    attention[:, 7:] = 0  # padding: HF turns it into finfo.min additive masks internally
    labels = torch.randint(0, 3, (4,))
    with torch_sentinel.attach(model, opt, check=check_mode) as s:
        for _ in range(3):
            opt.zero_grad()
            out = model(input_ids=ids, attention_mask=attention, labels=labels)
            out.loss.backward()
            opt.step()
    report = s.report()
    assert report.ok, str(report)
    assert report.steps == 3


def test_hf_model_nan_is_caught_in_the_right_layer(check_mode: str) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=60, n_embd=32, n_layer=2, n_head=2, n_positions=32)
    model = transformers.GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 60, (2, 8))
    s = torch_sentinel.attach(model, opt, check=check_mode)

    def loop() -> None:
        for step in range(4):
            if step == 2:
                with torch.no_grad():
                    model.transformer.h[1].mlp.c_fc.weight[0, 0] = math.nan
            opt.zero_grad()
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()

    err = _caught(s, loop)
    assert err is not None
    # The weights were non-finite when step 2 began: charged to the update of step 1.
    assert (err.step, err.boundary, err.module) == (1, "updates", "transformer.h.1.mlp.c_fc")


def test_cnn_and_transformer_models_are_quiet_in_both_modes(check_mode: str) -> None:
    for kind, cls in (("cnn", CNN), ("transformer", Transformer)):
        torch.manual_seed(0)
        model = cls()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        with torch_sentinel.attach(model, opt, check=check_mode) as s:
            train(model, opt, kind, 4)
        assert s.report().ok, str(s.report())


def test_lr_sentence_never_calls_a_zero_update_ratio_sane(check_mode: str) -> None:
    """Regression: a ratio of 0 (lr 0) is outside the update_ratio band; the message said the
    learning rate "looks sane"."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    steps = {"n": 0}

    def poison(module: nn.Module, args: object, out: torch.Tensor) -> torch.Tensor:
        steps["n"] += 1
        return out * math.nan if steps["n"] == 3 else out

    model.fc2.register_forward_hook(poison)
    err, _ = _run(model, opt, "mlp", 4, check_mode, update_every=1)
    assert err is not None and (err.step, err.boundary) == (2, "forward")
    assert err.evidence["update_ratio_before"]["max_ratio"] == 0.0
    with pytest.raises(NonFiniteError, match=r"update/weight ratio at step 1 was 0 .*below the healthy band"):
        raise err
    assert "looks sane" not in str(err)


def _corrupted_gain_run(check_mode: str, disable: frozenset[str] = frozenset()) -> Optional[NonFiniteError]:
    """Four elements of a LayerNorm gain multiplied by 2^70 between steps 2 and 3 (corrupted
    exponent bits): the outputs it scales square to infinity in the loss at step 3."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.LayerNorm(32), nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    s = torch_sentinel.attach(model, opt, check=check_mode, disable=disable)
    g = torch.Generator().manual_seed(0)

    def loop() -> None:
        for step in range(5):
            if step == 3:
                with torch.no_grad():
                    model[1].weight[:4] *= 2.0**70
            opt.zero_grad()
            x, y = torch.randn(8, 10, generator=g), torch.randn(8, 4, generator=g)
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()

    return _caught(s, loop)


def test_a_weight_rewritten_between_steps_is_named_as_the_cause(check_mode: str) -> None:
    """Regression (held-out spike benchmark, corrupted_weight-100): a weight corrupted between two
    steps made the next step non-finite, and the error advised an epsilon in a backward. The spike
    ring's last weight norms tell a weight that changed with no optimizer step in between."""
    err = _corrupted_gain_run(check_mode)
    assert err is not None and err.step == 3
    if check_mode == "deferred":
        # Described at a later flush: the optimizer has stepped since, so the weights now are
        # not the ones step 3 computed with, and nothing is claimed about them.
        assert err.evidence["likely_cause"] != "weights_changed"
        return
    assert err.evidence["likely_cause"] == "weights_changed"
    (moved,) = [c for c in err.evidence["likely_causes"] if c["cause"] == "weights_changed"]
    assert [w["parameter"] for w in moved["evidence"]["weights"]] == ["1.weight"]
    with pytest.raises(NonFiniteError, match=r"likely cause: a weight changed between optimizer steps"):
        raise err
    assert re.search(r"weight '1\.weight' changed from norm [\d.]+ after the optimizer's last step", str(err))


def test_without_the_spike_ring_the_same_fault_is_still_described(check_mode: str) -> None:
    err = _corrupted_gain_run(check_mode, disable=frozenset({"loss_spike"}))
    assert err is not None and err.step == 3
    assert err.evidence["likely_cause"] != "weights_changed"
