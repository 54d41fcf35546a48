"""no_gradient: optimizer parameters that never receive a gradient."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torch_sentinel


class Cut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).detach())


@pytest.mark.parametrize("set_to_none", [True, False], ids=["grad_none", "grad_zero"])
def test_detached_encoder(set_to_none: bool) -> None:
    torch.manual_seed(0)
    model = Cut()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(6):
            opt.zero_grad(set_to_none=set_to_none)
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
        report = s.report()
    (f,) = report.by_kind("no_gradient")
    assert f.module == "encoder" and f.boundary == "gradients" and f.evidence["count"] == 4
    assert report.boundary == "gradients" and report.next_check == "inspect_graph_connectivity"


def test_too_few_steps_is_not_evidence() -> None:
    torch.manual_seed(0)
    model = Cut()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
        assert s.report().by_kind("no_gradient") == []


def _rebuild_tolist(out: torch.Tensor) -> torch.Tensor:
    return torch.tensor(out.tolist(), requires_grad=True)


def _rebuild_numpy(out: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(out.detach().numpy().copy()).requires_grad_()


def _rebuild_detach(out: torch.Tensor) -> torch.Tensor:
    return out.detach().requires_grad_()


_REBUILDS = {"tolist": _rebuild_tolist, "numpy_round_trip": _rebuild_numpy, "detach_requires_grad": _rebuild_detach}


@pytest.mark.parametrize("rebuild", list(_REBUILDS), ids=list(_REBUILDS))
def test_graph_cut_by_rebuilding_the_output_is_named(rebuild: str) -> None:
    """Regression (issue 12): reported as no_update "zero_grad after backward" and as an
    unregistered_parameter "<unknown>, plain list?"."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(8):
            x = torch.randn(16, 4)
            opt.zero_grad()
            out = _REBUILDS[rebuild](model(x))  # the bug
            nn.functional.cross_entropy(out, (x[:, 0] > 0).long()).backward()
            opt.step()
        report = s.report()
    (f,) = report.by_kind("no_gradient")
    assert "new leaf tensor of shape (16, 3)" in f.message and "graph was cut" in f.message
    assert f.module == "" and f.onset_step == 0 and f.step is not None and f.step <= 20
    assert report.by_kind("unregistered_parameter") == []
    assert not any("zero_grad" in g.message for g in report.by_kind("no_update"))


class Pairwise(nn.Module):
    """RankNet's scorer: one network on two documents, the loss sees only the difference, so
    the last layer's bias cancels exactly."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU())
        self.score = nn.Linear(16, 1)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.score(self.body(a)) - self.score(self.body(b))


def test_a_bias_that_cancels_by_construction_is_info_with_its_reason() -> None:
    torch.manual_seed(0)
    model = Pairwise()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(12):
            a, b = torch.randn(16, 6), torch.randn(16, 6)
            opt.zero_grad()
            nn.functional.binary_cross_entropy_with_logits(model(a, b).squeeze(1), (a.sum(1) > b.sum(1)).float()).backward()
            opt.step()
        report = s.report()
    (f,) = report.by_kind("no_gradient")
    assert f.severity == "info" and f.module == "score" and f.evidence["parameters"] == ["score.bias"]
    assert "by construction" in f.message and f.evidence["output_gradient_arrived"]["score"] > 0
    assert report.ok


@pytest.mark.parametrize("cut", ["no_grad", "detached", "unused"], ids=["no_grad", "detached", "unused"])
def test_a_network_cut_off_from_the_loss_is_named_with_how(cut: str) -> None:
    """Two networks, two optimizers: the encoder's optimizer steps every iteration while its
    network never gets a gradient (CIC's encoder under no_grad, a GAN generator's detached output,
    a network the loss does not use)."""
    torch.manual_seed(0)
    model = nn.ModuleDict({"encoder": nn.Sequential(nn.Sequential(nn.Linear(8, 16), nn.Tanh())),
                           "head": nn.Linear(16, 1)})
    opts = [torch.optim.Adam(model["encoder"].parameters(), lr=1e-3), torch.optim.Adam(model["head"].parameters(), lr=1e-3)]
    with torch_sentinel.attach(model, opts) as s:
        for _ in range(8):
            x = torch.randn(16, 8)
            for o in opts:
                o.zero_grad()
            if cut == "no_grad":
                with torch.no_grad():
                    h = model["encoder"](x)
            elif cut == "detached":
                h = model["encoder"](x).detach()
            else:
                h = torch.tanh(x @ torch.ones(8, 16))
            nn.functional.mse_loss(model["head"](h), x[:, :1]).backward()
            for o in opts:
                o.step()
        (f,) = s.report().by_kind("no_gradient")
    assert f.severity == "error" and f.module == "encoder" and f.evidence["optimizer"] == 0
    assert "optimizer 0" in f.message
    assert {"no_grad": "torch.no_grad()", "detached": "detached", "unused": "did not run"}[cut] in f.message


def test_an_embedding_padding_row_is_info_at_attach() -> None:
    model = nn.Sequential(nn.Embedding(10, 4, padding_idx=0), nn.Flatten(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_sentinel.attach(model, opt) as s:
        (f,) = s.findings  # before any step
        for _ in range(6):
            opt.zero_grad()
            model(torch.randint(0, 10, (4, 2))).sum().backward()
            opt.step()
        report = s.report()
    assert (f.kind, f.severity, f.module, f.step) == ("no_gradient", "info", "0.weight", 0)
    assert f.evidence == {"parameter": "0.weight", "row": 0, "reason": "padding_idx"} and report.ok
