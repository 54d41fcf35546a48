"""missing_zero_grad: gradients carried across steps; accumulation within a step is healthy."""

from __future__ import annotations

from typing import Optional

import pytest
import torch
from torch import nn

import torch_sentinel
from torch_sentinel import Finding

CASES = {
    "never_zeroed": (None, 1, True),
    "set_to_none_false": (False, 1, False),
    "accumulate_4_microbatches": (True, 4, False),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_stale_gradients(case: str) -> None:
    set_to_none, micro, fires = CASES[case]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(8):
            if set_to_none is not None:
                opt.zero_grad(set_to_none=set_to_none)
            for _ in range(micro):
                (model(torch.randn(8, 4)).pow(2).mean() / micro).backward()
            opt.step()
        hits = s.report().by_kind("missing_zero_grad")
    assert bool(hits) is fires
    if fires:
        ev = hits[0].evidence
        assert ev["steps"] == [1, 2, 3] and all(v > 0 for v in ev["stale_grad_norm"])


def _gan() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    net_g = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    net_d = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1), nn.Sigmoid())
    return net_g, net_d


GAN_CASES = {
    # name: (attach as, which zero_grad is left out, G micro-batches, D steps per G step, set_to_none)
    "healthy_one_container": ("container", None, 1, 1, True),
    "healthy_two_sentinels": ("two", None, 1, 1, True),
    "healthy_set_to_none_false": ("container", None, 1, 1, False),
    "healthy_generator_accumulates_3": ("container", None, 3, 1, True),
    "healthy_five_critic_steps": ("container", None, 1, 5, True),
    "generator_never_zeroed": ("container", "G", 1, 1, True),
    "generator_never_zeroed_five_critic_steps": ("container", "G", 1, 5, True),
    "discriminator_never_zeroed": ("container", "D", 1, 1, False),
}


def _dcgan_loop(attach_as: str, skip: Optional[str], g_micro: int, d_steps: int, set_to_none: bool) -> list[Finding]:
    net_g, net_d = _gan()
    opt_d = torch.optim.Adam(net_d.parameters(), lr=2e-3, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(net_g.parameters(), lr=2e-3, betas=(0.5, 0.999))
    bce = nn.BCELoss()
    if attach_as == "container":
        sentinels = [torch_sentinel.attach(nn.ModuleDict({"netG": net_g, "netD": net_d}), [opt_d, opt_g])]
    else:
        sentinels = [torch_sentinel.attach(net_g, opt_g), torch_sentinel.attach(net_d, opt_d)]
    g = torch.Generator().manual_seed(1)
    try:
        for _ in range(8):
            for _ in range(d_steps):
                if skip != "D":
                    net_d.zero_grad(set_to_none=set_to_none)
                real = torch.randn(32, 2, generator=g) + 2
                bce(net_d(real).view(-1), torch.ones(32)).backward()
                fake = net_g(torch.randn(32, 4, generator=g))
                bce(net_d(fake.detach()).view(-1), torch.zeros(32)).backward()
                opt_d.step()
            if skip != "G":
                opt_g.zero_grad(set_to_none=set_to_none)
            for _ in range(g_micro):
                fake = net_g(torch.randn(32, 4, generator=g))
                (bce(net_d(fake).view(-1), torch.ones(32)) / g_micro).backward()
            opt_g.step()
        return [f for s in sentinels for f in s.report().findings if f.kind in ("missing_zero_grad", "no_update")]
    finally:
        for s in sentinels:
            s.detach()


@pytest.mark.parametrize("case", list(GAN_CASES), ids=list(GAN_CASES))
def test_missing_zero_grad_per_optimizer(case: str) -> None:
    """Regression (issue 12, realworld dcgan/no_netG_zero_grad): one sentinel over a container
    with two optimizers checks each optimizer's own gradients between its own steps; the
    generator's loss reaching the discriminator (cleared by netD.zero_grad() later), critic
    steps and micro-batch accumulation stay quiet."""
    attach_as, skip, g_micro, d_steps, set_to_none = GAN_CASES[case]
    hits = _dcgan_loop(attach_as, skip, g_micro, d_steps, set_to_none)
    if skip is None:
        assert hits == []  # nor no_update on a generator that steps once per 5 critic steps
        return
    (f,) = [h for h in hits if h.kind == "missing_zero_grad"]
    owner = "netG" if skip == "G" else "netD"
    assert f.module == owner and f.evidence["optimizer"] == (1 if skip == "G" else 0)
    assert len(f.evidence["steps"]) == 3 and f.onset_step == f.evidence["steps"][0] == 2 * d_steps - 1
    assert f.step == f.evidence["steps"][-1] and f.step - f.onset_step <= 20
    assert "gradients never cleared since its previous step" in f.message
    assert f"expected a zero_grad() for '{owner}'" in f.message


@pytest.mark.parametrize("zero_grad", [True, False], ids=["zeroed", "closure_without_zero_grad"])
def test_lbfgs_closure_with_a_second_optimizer(zero_grad: bool) -> None:
    """LBFGS runs its backward()s inside step(): a closure that clears the gradients is
    quiet; one that never does is found per optimizer (seen at the other optimizer's backward)."""
    torch.manual_seed(0)
    a, b = nn.Linear(4, 4), nn.Linear(4, 1)
    model = nn.ModuleDict({"a": a, "b": b})
    lbfgs = torch.optim.LBFGS(a.parameters(), lr=0.1, max_iter=3)
    sgd = torch.optim.SGD(b.parameters(), lr=0.01)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    with torch_sentinel.attach(model, [lbfgs, sgd]) as s:
        for _ in range(10):
            def closure() -> torch.Tensor:
                if zero_grad:
                    lbfgs.zero_grad()
                loss = b(a(x)).sub(y).pow(2).mean()
                loss.backward()
                return loss
            lbfgs.step(closure)
            sgd.zero_grad()
            b(a(x).detach()).sub(y).pow(2).mean().backward()
            sgd.step()
        hits = s.report().by_kind("missing_zero_grad")
    if zero_grad:
        assert hits == []
    else:  # the closure's gradients pile up across LBFGS steps: seen at the SGD backward between them
        (f,) = hits
        assert f.module == "a" and f.evidence["optimizer"] == 0
