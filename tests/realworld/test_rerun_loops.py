"""The rerun that localises a forward fault on an ordinary step, on the loops users write.

In immediate mode an ordinary step hooks only the modules it needs (``watching.py``) and checks
the model's outputs; a non-finite output there is localised by running the step's forward again
with every module hooked (``rerun.py``). These tests inject a NaN inside a named submodule, on
an ordinary step and, as a control, on a sampled one, in a GAN and WGAN-GP (two models, two
sentinels), LBFGS with a closure, gradient accumulation, CPU bfloat16 autocast, a hand-written
update without an optimizer and HF GPT-2: the error must name the step, the module of the right
model and how it was found. Loops that go on after the fault (catching the error, or
``on_nonfinite="record"``) must train bit-identically to an unattached twin; the rerun's Python
side effects are pinned.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any, Callable, Optional

import pytest
import torch
from torch import nn

import torch_sentinel
from torch_sentinel import NonFiniteError
from torch_sentinel._collect.cadence import sampled

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ORDINARY, SAMPLED = 23, 20
assert not sampled(ORDINARY) and sampled(SAMPLED)
STEPS = [pytest.param(ORDINARY, id="ordinary"), pytest.param(SAMPLED, id="sampled")]
RERUN = "run again with every module watched"


class Poisoned(nn.Module):
    """A Linear whose own output turns NaN while ``poison`` is set (the loop sets it)."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d_in, d_out)
        self.poison = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return y * float("nan") if self.poison else y


class Net(nn.Module):
    """fc1 -> act -> fc2 (Poisoned) -> act -> head."""

    def __init__(self, d_in: int, hidden: int, d_out: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.act = nn.LeakyReLU(0.2)
        self.fc2 = Poisoned(hidden, hidden)
        self.act2 = nn.LeakyReLU(0.2)
        self.head = nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act2(self.fc2(self.act(self.fc1(x)))))


class DropNet(Net):
    """Net with BatchNorm and Dropout before fc2: the rerun must draw the same mask (same RNG
    state) and leave BatchNorm's running statistics as the first run left them."""

    def __init__(self, d_in: int, hidden: int, d_out: int) -> None:
        super().__init__(d_in, hidden, d_out)
        self.bn = nn.BatchNorm1d(hidden)
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act2(self.fc2(self.drop(self.bn(self.act(self.fc1(x)))))))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _check(err: NonFiniteError, step: int, module: str) -> None:
    assert (err.step, err.boundary, err.module) == (step, "forward", module), str(err)
    located_by = err.evidence["located_by"]
    assert (RERUN in located_by) == (not sampled(step)), located_by


# ---------------------------------------------------------------------------------------- GAN
class GanRun:
    """The DCGAN loop (pytorch/examples dcgan/main.py), one sentinel per net: D on real and on
    ``fake.detach()``, one D step; then G through D, one G step. The NaN is made at ``step``
    inside ``where``'s fc2: in D on the fake pass only, or in G. With ``skip`` the loop catches
    NonFiniteError and drops the batch (an unattached twin drops it after the same forward)."""

    def __init__(self, step: int, where: str, policy: str = "raise", attached: bool = True,
                 skip: bool = False) -> None:
        self.step, self.where, self.attached, self.skip = step, where, attached, skip
        torch.manual_seed(0)
        self.net_g, self.net_d = DropNet(4, 16, 2), DropNet(2, 16, 1)
        self.opt_g = torch.optim.Adam(self.net_g.parameters(), lr=2e-4, betas=(0.5, 0.999))
        self.opt_d = torch.optim.Adam(self.net_d.parameters(), lr=2e-4, betas=(0.5, 0.999))
        self.sg = self.sd = None
        if attached:
            self.sg = torch_sentinel.attach(self.net_g, self.opt_g, on_nonfinite=policy)
            self.sd = torch_sentinel.attach(self.net_d, self.opt_d, on_nonfinite=policy)
        self.skipped: list[int] = []
        self.error: Optional[NonFiniteError] = None

    def _forward(self, net: nn.Module, x: torch.Tensor, poison: bool) -> Optional[torch.Tensor]:
        """``net(x)``; None where the loop drops the batch."""
        net.fc2.poison = poison
        try:
            out = net(x)
        except NonFiniteError:
            if not self.skip:
                raise
            return None
        finally:
            net.fc2.poison = False
        if poison and self.skip and not self.attached:
            return None  # the twin drops the same batch, after the same forward
        return out

    def run(self) -> GanRun:
        net_g, net_d, bce = self.net_g, self.net_d, nn.BCEWithLogitsLoss()
        g = torch.Generator().manual_seed(1)
        torch.manual_seed(2)
        try:
            for i in range(self.step + 3):
                real = torch.randn(8, 2, generator=g)
                z = torch.randn(8, 4, generator=g)
                ones, zeros = torch.ones(8, 1), torch.zeros(8, 1)
                fake = self._forward(net_g, z, self.where == "G" and i == self.step)
                if fake is None:
                    self.skipped.append(i)
                    continue
                net_d.zero_grad()
                bce(net_d(real), ones).backward()
                out = self._forward(net_d, fake.detach(), self.where == "D" and i == self.step)
                if out is None:
                    self.skipped.append(i)
                    continue
                bce(out, zeros).backward()
                self.opt_d.step()
                net_g.zero_grad()
                bce(net_d(fake), ones).backward()
                self.opt_g.step()
        except NonFiniteError as exc:
            self.error = exc
        finally:
            for s in (self.sg, self.sd):
                if s is not None:
                    s.detach(quiet=True)
        return self

    def non_finite(self, net: str) -> list[tuple[int, str, Optional[str]]]:
        sentinel = {"G": self.sg, "D": self.sd}[net]
        assert sentinel is not None
        return [(f.step, f.boundary, f.module) for f in sentinel.findings if f.kind == "non_finite"]


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("where", ["D", "G"], ids=["in-D-fake-pass", "in-G"])
def test_gan_names_the_module_of_the_model_that_made_the_nan(step: int, where: str) -> None:
    with _quiet():
        run = GanRun(step, where).run()
    assert run.error is not None
    _check(run.error, step, "fc2")
    other = "G" if where == "D" else "D"
    assert run.non_finite(where) == [(step, "forward", "fc2")]
    assert run.non_finite(other) == []


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("where", ["D", "G"], ids=["in-D-fake-pass", "in-G"])
def test_gan_recording_every_fault_charges_no_module_of_the_other_net(step: int, where: str) -> None:
    """on_nonfinite="record": the NaN flows on (D's weights after its step, or G's output into
    D); the other net's sentinel reports it where it entered (its batch, or its loss, which
    runs through D), never in one of its own modules."""
    with _quiet():
        run = GanRun(step, where, policy="record").run()
    assert run.error is None
    assert run.non_finite(where)[0] == (step, "forward", "fc2")
    other = "G" if where == "D" else "D"
    entered = {"D": "loss", "G": "data"}[where]  # G's loss runs through D; D's batch is G's output
    assert run.non_finite(other) == [(step, entered, None)]
    # G's loss runs through D: its report points at the other model (D's is its own batch)
    [finding] = [f for f in {"G": run.sg, "D": run.sd}[other].findings if f.kind == "non_finite"]
    assert finding.evidence.get("loss_through_other_model", False) is (other == "G")


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("where", ["D", "G"], ids=["in-D-fake-pass", "in-G"])
def test_gan_skipping_the_bad_batch_trains_as_the_unattached_twin(step: int, where: str) -> None:
    with _quiet():
        run = GanRun(step, where, skip=True).run()
        twin = GanRun(step, where, attached=False, skip=True).run()
    assert run.skipped == twin.skipped == [step]
    for net, twin_net in ((run.net_g, twin.net_g), (run.net_d, twin.net_d)):
        for (k, v), t in zip(net.state_dict().items(), twin_net.state_dict().values()):
            assert torch.equal(v, t), k


def _wgan_gp(step: int) -> None:
    """WGAN-GP (Gulrajani et al.'s loop): D on an interpolate that requires grad, its gradient
    penalty by ``autograd.grad(create_graph=True)``, then D on fake and real; the NaN in D's
    interpolate pass."""
    torch.manual_seed(0)
    net_g, net_d = Net(4, 16, 2), Net(2, 16, 1)
    opt_g = torch.optim.Adam(net_g.parameters(), lr=1e-4, betas=(0.5, 0.9))
    opt_d = torch.optim.Adam(net_d.parameters(), lr=1e-4, betas=(0.5, 0.9))
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(net_g, opt_g), torch_sentinel.attach(net_d, opt_d):
        for i in range(step + 3):
            real, z = torch.randn(8, 2, generator=g), torch.randn(8, 4, generator=g)
            fake = net_g(z)
            opt_d.zero_grad()
            eps = torch.rand(8, 1, generator=g)
            interp = (eps * real + (1 - eps) * fake.detach()).requires_grad_(True)
            net_d.fc2.poison = i == step
            d_interp = net_d(interp)
            net_d.fc2.poison = False
            grad, = torch.autograd.grad(d_interp.sum(), interp, create_graph=True)
            penalty = ((grad.norm(2, dim=1) - 1) ** 2).mean()
            (net_d(fake.detach()).mean() - net_d(real).mean() + 10 * penalty).backward()
            opt_d.step()
            opt_g.zero_grad()
            (-net_d(fake).mean()).backward()
            opt_g.step()



# -------------------------------------------------------------------------------------- LBFGS
def _closure(model: Net, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
             poison_at: int) -> Callable[[], torch.Tensor]:
    """The step's closure; its ``poison_at``-th evaluation (1-based, 0: none) makes the NaN."""
    calls = 0

    def closure() -> torch.Tensor:
        nonlocal calls
        calls += 1
        model.fc2.poison = calls == poison_at
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        model.fc2.poison = False
        loss.backward()
        return loss

    return closure


def _lbfgs(step: int) -> None:
    """LBFGS, up to four closure evaluations a step; the NaN on the step's second evaluation,
    not the first forward of the step."""
    torch.manual_seed(0)
    model = Net(6, 16, 1)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4, history_size=5)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(16, 6, generator=g), torch.randn(16, 1, generator=g)) for _ in range(step + 3)]
    with torch_sentinel.attach(model, opt):
        for i, (x, y) in enumerate(data):
            opt.step(_closure(model, opt, x, y, 2 if i == step else 0))



# ---------------------------------------------------------------------------- accumulation
MICRO = 4


def _accumulate(step: int, attached: bool = True, skip: bool = False) -> tuple[list[int], dict[str, Any], Any]:
    """Four micro-batches per optimizer step, the loss divided by four; the NaN on micro-batch
    3 of ``step``. With ``skip`` the loop catches the error (the unattached twin skips the
    same step after the same forward) and drops that step's gradients."""
    torch.manual_seed(0)
    model = DropNet(6, 16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    sentinel = torch_sentinel.attach(model, opt) if attached else None
    skipped = []
    try:
        for i in range(step + 4):
            opt.zero_grad()
            bad = False
            for k in range(MICRO):
                x, y = torch.randn(8, 6, generator=g), torch.randn(8, 1, generator=g)
                model.fc2.poison = i == step and k == 2
                try:
                    out = model(x)
                except NonFiniteError:
                    if not skip:
                        raise
                    bad = True
                    break
                finally:
                    model.fc2.poison = False
                if not attached and skip and i == step and k == 2:
                    bad = True  # the twin skips the same micro-batch, after the same forward
                    break
                (nn.functional.mse_loss(out, y) / MICRO).backward()
            if bad:
                skipped.append(i)
                continue
            opt.step()
    finally:
        if sentinel is not None:
            sentinel.detach(quiet=True)
    return skipped, model.state_dict(), torch.get_rng_state()



@pytest.mark.parametrize("step", STEPS)
def test_skipping_the_bad_accumulated_step_trains_as_the_unattached_twin(step: int) -> None:
    with _quiet():
        skipped, state, rng = _accumulate(step, attached=True, skip=True)
        twin_skipped, twin_state, twin_rng = _accumulate(step, attached=False, skip=True)
    assert skipped == twin_skipped == [step]
    assert torch.equal(rng, twin_rng)
    for k, v in twin_state.items():
        assert torch.equal(state[k], v), k


# ----------------------------------------------------------------------------------- autocast
def _autocast(step: int) -> None:
    torch.manual_seed(0)
    model = DropNet(6, 16, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt):
        for i in range(step + 3):
            x, y = torch.randn(8, 6, generator=g), torch.randn(8, 1, generator=g)
            model.fc2.poison = i == step
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x)
                assert out.dtype is torch.bfloat16
                loss = nn.functional.mse_loss(out.float(), y)
            loss.backward()
            opt.step()



# ------------------------------------------------------------------------------ no optimizer
def _hand_sgd(step: int) -> None:
    torch.manual_seed(0)
    model = DropNet(6, 16, 1)
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model):
        for i in range(step + 3):
            x, y = torch.randn(8, 6, generator=g), torch.randn(8, 1, generator=g)
            model.fc2.poison = i == step
            nn.functional.mse_loss(model(x), y).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.05 * p.grad
                    p.grad = None



#: The loop styles above, each with the NaN in ``fc2`` (the WGAN-GP's in D's interpolate pass,
#: the accumulation's on the third micro-batch, LBFGS's in a closure evaluation).
LOOPS: dict[str, Callable[[int], Any]] = {
    "wgan-gp-interpolate-pass": _wgan_gp,
    "lbfgs-closure": _lbfgs,
    "accumulation-third-micro-batch": _accumulate,
    "cpu-autocast-bf16": _autocast,
    "no-optimizer-hand-written-sgd": _hand_sgd,
}


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("loop", list(LOOPS.values()), ids=list(LOOPS))
def test_each_loop_style_names_the_module_that_made_the_nan(loop: Callable[[int], Any], step: int) -> None:
    with _quiet(), pytest.raises(NonFiniteError, match=rf"step {step}\b.*fc2") as info:
        loop(step)
    _check(info.value, step, "fc2")
    if loop is _autocast:
        assert info.value.dtype == "bfloat16"


# ------------------------------------------------------------------------------------ GPT-2
def _gpt2(step: int, hook_first: bool) -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(
        n_layer=3, n_embd=32, n_head=4, vocab_size=128, n_positions=16, bos_token_id=0, eos_token_id=0,
    )  # dropout left on (0.1): the rerun must draw the same masks
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    poison = [False]

    def inject(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        return output * float("nan") if poison[0] else output

    mlp = model.transformer.h[1].mlp
    if hook_first:
        mlp.register_forward_hook(inject)
    with torch_sentinel.attach(model, opt):
        if not hook_first:
            mlp.register_forward_hook(inject)
        for i in range(step + 3):
            ids = torch.randint(0, 128, (2, 12), generator=g)
            poison[0] = i == step
            opt.zero_grad()
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("hook_first", [
    pytest.param(True, id="hook-before-attach"),
    pytest.param(False, id="hook-after-attach"),
])
def test_gpt2_names_the_mlp_a_user_hook_poisons(step: int, hook_first: bool) -> None:
    with _quiet(), pytest.raises(NonFiniteError, match=rf"step {step}\b.*transformer\.h\.1\.mlp") as info:
        _gpt2(step, hook_first)
    _check(info.value, step, "transformer.h.1.mlp")


# ------------------------------------------------------------------------ forward side effects
class Counting(DropNet):
    """A forward with Python side effects: a call counter on the model, one in a user's
    pre-hook on a submodule, one in a user's pre-hook on the model itself."""

    def __init__(self) -> None:
        super().__init__(6, 16, 1)
        self.calls = 0
        self.fc2_hook_calls = 0
        self.root_hook_calls = 0
        self.fc2.register_forward_pre_hook(self._count_fc2)
        self.register_forward_pre_hook(self._count_root)

    def _count_fc2(self, module: nn.Module, args: Any) -> None:
        self.fc2_hook_calls += 1

    def _count_root(self, module: nn.Module, args: Any) -> None:
        self.root_hook_calls += 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x)


@pytest.mark.parametrize("step", STEPS)
def test_the_rerun_repeats_the_forwards_python_side_effects(step: int) -> None:
    """Pinned behaviour (README, Limitations): the rerun on an ordinary step runs the model's
    forward and its submodules' hooks a second time, so counters there count it; the model's
    own hooks do not run again (``forward``, not ``__call__``). Tensors are left as they were
    (the tests above); Python attributes are not."""
    torch.manual_seed(0)
    model = Counting()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    forwards = 0
    with _quiet(), pytest.raises(NonFiniteError, match=rf"step {step}\b.*fc2") as info, \
            torch_sentinel.attach(model, opt):
        for i in range(step + 2):
            x, y = torch.randn(8, 6, generator=g), torch.randn(8, 1, generator=g)
            model.fc2.poison = i == step
            opt.zero_grad()
            forwards += 1
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    _check(info.value, step, "fc2")
    again = 0 if sampled(step) else 1
    assert (model.calls, model.fc2_hook_calls, model.root_hook_calls) == (forwards + again, forwards + again, forwards)


# ------------------------------------------------------------- training on after a rerun (record)
class CleansInput(DropNet):
    """Sets NaNs in its batch to zero in place, defensively, before the first layer (which saves
    the batch for its backward)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.nan_to_num_(0.0))


def _skip_nonfinite_updates(cls: Callable[..., nn.Module], step: int, attached: bool) -> tuple[list[int], Any, Any]:
    """on_nonfinite="record": every step runs its backward; a step whose gradient norm is not
    finite is not applied (the GradScaler / HF Trainer pattern)."""
    torch.manual_seed(0)
    model = cls(6, 16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    sentinel = torch_sentinel.attach(model, opt, on_nonfinite="record") if attached else None
    skipped = []
    for i in range(step + 4):
        x, y = torch.randn(8, 6, generator=g), torch.randn(8, 1, generator=g)
        model.fc2.poison = i == step
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        if not torch.isfinite(nn.utils.clip_grad_norm_(model.parameters(), 10.0)):
            skipped.append(i)
            continue
        opt.step()
    findings = None
    if sentinel is not None:
        sentinel.detach(quiet=True)
        findings = [(f.step, f.boundary, f.module) for f in sentinel.findings if f.kind == "non_finite"]
    return skipped, model.state_dict(), findings


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("cls", [DropNet, CleansInput], ids=["batchnorm-buffers", "input-cleaned-in-place"])
def test_the_loop_trains_on_after_a_rerun_as_the_unattached_twin(cls: Callable[..., nn.Module], step: int) -> None:
    """Regression: the rerun wrote the buffers back (and ran BatchNorm's update, and the
    forward's in-place change of its input, a second time) into tensors the first run's graph
    had saved, so the loop's backward failed ("modified by an inplace operation")."""
    with _quiet():
        skipped, state, findings = _skip_nonfinite_updates(cls, step, attached=True)
        twin_skipped, twin_state, _ = _skip_nonfinite_updates(cls, step, attached=False)
    assert skipped == twin_skipped == [step]
    assert findings is not None and findings[0] == (step, "forward", "fc2")
    for k, v in twin_state.items():
        assert torch.equal(state[k], v), k


def test_a_generator_loss_the_discriminator_made_non_finite_points_at_it() -> None:
    """D's weights go NaN between its step and G's: G's outputs are finite, its loss is not. G's
    sentinel reports the loss boundary and says the loss runs through another attached model."""
    torch.manual_seed(0)
    net_g, net_d = Net(4, 8, 2), Net(2, 8, 1)
    opt_g = torch.optim.SGD(net_g.parameters(), lr=0.01)
    opt_d = torch.optim.SGD(net_d.parameters(), lr=0.01)
    bce = nn.BCEWithLogitsLoss()
    ones, zeros = torch.ones(8, 1), torch.zeros(8, 1)
    expected = r"(?s)step 4\b.*boundary 'loss'.*runs through another attached model.*check that model's report"
    with _quiet(), torch_sentinel.attach(net_g, opt_g), \
            torch_sentinel.attach(net_d, opt_d, on_nonfinite="record"), \
            pytest.raises(NonFiniteError, match=expected) as info:
        for i in range(6):
            fake = net_g(torch.randn(8, 4))
            opt_d.zero_grad()
            (bce(net_d(torch.randn(8, 2)), ones) + bce(net_d(fake.detach()), zeros)).backward()
            opt_d.step()
            if i == 4:
                with torch.no_grad():
                    net_d.head.weight.fill_(float("nan"))
            opt_g.zero_grad()
            bce(net_d(fake), ones).backward()
            opt_g.step()
    assert (info.value.step, info.value.boundary, info.value.module) == (4, "loss", None)
    assert info.value.evidence["loss_through_other_model"] is True
