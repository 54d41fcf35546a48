"""Scoping: a backward belongs to a sentinel only if its graph reaches the sentinel's model.

Real small models and the loop's own loss values, compared exactly.
"""

from __future__ import annotations

import math
import threading

import pytest
import torch
from torch import nn

import torch_sentinel
from torch_sentinel import NonFiniteError


def _gan(seed: int = 0) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    G = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    D = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    return G, D


def _gan_loop(G: nn.Module, D: nn.Module, optG: torch.optim.Optimizer, optD: torch.optim.Optimizer,
              steps: int, *, fault: str = "", fault_step: int = 5, zero: str = "module"
              ) -> tuple[list[float], list[float]]:
    """The DCGAN recipe: D on real and detached fake (two backward calls, one step), then G.

    ``zero``: how gradients are cleared: ``module`` (``D.zero_grad()``, to None), ``module-in-place``
    (``D.zero_grad(set_to_none=False)``) or ``optimizer-in-place`` (``optD.zero_grad(set_to_none=False)``).
    """

    def clear(net: nn.Module, opt: torch.optim.Optimizer) -> None:
        if zero == "module":
            net.zero_grad()
        elif zero == "module-in-place":
            net.zero_grad(set_to_none=False)
        else:
            opt.zero_grad(set_to_none=False)

    bce = nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(1)
    loss_d, loss_g = [], []
    for step in range(steps):
        real = torch.randn(32, 2, generator=g) * 0.5 + torch.tensor([2.0, -1.0])
        z = torch.randn(32, 8, generator=g)
        if step == fault_step and fault:
            with torch.no_grad():
                (G if fault == "G" else D)[0].weight[0, 0] = math.nan
        clear(D, optD)
        err_real = bce(D(real), torch.ones(32, 1))
        err_real.backward()
        fake = G(z)
        err_fake = bce(D(fake.detach()), torch.zeros(32, 1))
        err_fake.backward()
        optD.step()
        loss_d.append((err_real.detach() + err_fake.detach()).item())
        clear(G, optG)
        err_g = bce(D(fake), torch.ones(32, 1))
        err_g.backward()
        optG.step()
        loss_g.append(err_g.item())
    return loss_d, loss_g


def _optimizers(G: nn.Module, D: nn.Module) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
    return (torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.999)),
            torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.999)))


def _losses(sentinel: torch_sentinel.Sentinel) -> list[float]:
    sentinel.flush()
    return [r.loss for r in sentinel.recent_records()]


@pytest.mark.parametrize(("check", "zero"), [("immediate", "module"), ("deferred", "module"),
                                             ("immediate", "module-in-place"), ("deferred", "optimizer-in-place")],
                         ids=["immediate", "deferred", "zero-in-place-immediate", "optimizer-zero-in-place-deferred"])
def test_gan_with_two_sentinels_is_quiet_and_each_loss_is_its_own_network_loss(check: str, zero: str) -> None:
    """Also with gradients zeroed in place (``set_to_none=False``): zeroing counts as clearing,
    so the generator's loss, which also reaches D, is not counted in D's row."""
    G, D = _gan()
    optG, optD = _optimizers(G, D)
    sg = torch_sentinel.attach(G, optG, check=check)
    sd = torch_sentinel.attach(D, optD, check=check)
    try:
        loss_d, loss_g = _gan_loop(G, D, optG, optD, 120, zero=zero)
        assert _losses(sg) == loss_g[-len(_losses(sg)):]
        assert _losses(sd) == loss_d[-len(_losses(sd)):]
        assert sg.report(all_ranks=False).findings == []
        assert sd.report(all_ranks=False).findings == []
    finally:
        sg.detach()
        sd.detach()


@pytest.mark.parametrize("faulty", ["G", "D"], ids=["generator", "discriminator"])
def test_a_fault_in_one_gan_network_is_reported_by_that_networks_sentinel(faulty: str) -> None:
    G, D = _gan()
    optG, optD = _optimizers(G, D)
    sg = torch_sentinel.attach(G, optG)
    sd = torch_sentinel.attach(D, optD)
    try:
        with pytest.raises(NonFiniteError) as info:
            _gan_loop(G, D, optG, optD, 8, fault=faulty)
    finally:
        sg.detach()
        sd.detach()
    mine, other = (sg, sd) if faulty == "G" else (sd, sg)
    assert [f.kind for f in mine.findings] == ["non_finite"]
    assert other.findings == []
    assert info.value.module == "0"


def test_interleaved_forwards_charge_each_loss_to_its_own_model() -> None:
    torch.manual_seed(0)
    a, b = nn.Linear(4, 1), nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.01), torch.optim.SGD(b.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(3)
    expected_a, expected_b = [], []
    with torch_sentinel.attach(a, opt_a) as sa, torch_sentinel.attach(b, opt_b) as sb:
        for _ in range(6):
            x, y = torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)
            opt_a.zero_grad()
            opt_b.zero_grad()
            out_a, out_b = a(x), b(x)  # both forwards before either backward
            loss_b = nn.functional.mse_loss(out_b, y)
            loss_a = nn.functional.l1_loss(out_a, y)
            loss_b.backward()
            loss_a.backward()
            opt_a.step()
            opt_b.step()
            expected_a.append(loss_a.item())
            expected_b.append(loss_b.item())
        assert _losses(sa) == expected_a
        assert _losses(sb) == expected_b


def test_two_models_in_two_threads_each_record_their_own_losses() -> None:
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1)) for _ in range(2)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in models]
    sentinels = [torch_sentinel.attach(m, o) for m, o in zip(models, opts)]
    expected: list[list[float]] = [[], []]
    start = threading.Barrier(2)

    def loop(k: int) -> None:
        g = torch.Generator().manual_seed(10 + k)
        start.wait()
        for _ in range(20):
            x, y = torch.randn(8, 6, generator=g), torch.randn(8, 1, generator=g)
            opts[k].zero_grad()
            loss = nn.functional.mse_loss(models[k](x), y) * (k + 1)
            loss.backward()
            opts[k].step()
            expected[k].append(loss.item())

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for k in range(2):
            assert _losses(sentinels[k]) == expected[k]
    finally:
        for s in sentinels:
            s.detach()


def test_lbfgs_records_the_loss_step_returns_and_norms_once_per_step() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(32, 5, generator=g), torch.randn(32, 1, generator=g)
    returned, evaluations = [], []

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        evaluations.append(loss.item())
        return loss

    with torch_sentinel.attach(model, opt) as sentinel:
        for _ in range(4):
            returned.append(opt.step(closure).item())
        records = sentinel.recent_records()
        sentinel.flush()
        records = sentinel.recent_records()
    assert len(evaluations) > len(returned)  # the line search evaluated the closure again
    assert [r.loss for r in records] == returned
    assert [r.meta.backward_calls for r in records] == [1, 1, 1, 1]
    assert all(r.meta.weights_recorded for r in records)


def test_one_sentinel_over_a_gan_container_with_two_optimizers_is_quiet_and_sums_both_losses() -> None:
    G, D = _gan()
    optG, optD = _optimizers(G, D)
    gan = nn.ModuleDict({"netG": G, "netD": D})
    bce = nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(1)
    expected = []
    with torch_sentinel.attach(gan, [optD, optG]) as sentinel:
        for _ in range(120):
            real = torch.randn(32, 2, generator=g) * 0.5 + torch.tensor([2.0, -1.0])
            z = torch.randn(32, 8, generator=g)
            D.zero_grad()
            err_real = bce(D(real), torch.ones(32, 1))
            err_real.backward()
            fake = G(z)
            err_fake = bce(D(fake.detach()), torch.zeros(32, 1))
            err_fake.backward()
            optD.step()
            G.zero_grad()
            err_g = bce(D(fake), torch.ones(32, 1))
            err_g.backward()
            optG.step()
            expected.append((err_real.detach() + err_fake.detach() + err_g.detach()).item())
        recorded = _losses(sentinel)
        assert recorded == expected[-len(recorded):]
        assert [r.meta.backward_calls for r in sentinel.recent_records()] == [3] * len(recorded)
        assert sentinel.report(all_ranks=False).findings == []
