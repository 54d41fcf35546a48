"""The detectors' device-side collection adds no host reads to training steps, and detach()
restores every function it patched."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import torch_sentinel
from torch_sentinel.detectors import builtin_detectors
from torch_sentinel.testing import count_host_syncs


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.drop = nn.Dropout(0.1)
        self.bn = nn.BatchNorm1d(16)
        self.fc2 = nn.Linear(16, 3)
        self.sig = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(F.relu(self.bn(self.fc1(x))))
        return self.fc2(h.relu()) + self.sig(h).mean(1, keepdim=True)


def _steps(model: nn.Module, opt: torch.optim.Optimizer, n: int) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(n):
        x = torch.randn(16, 8, generator=g)
        y = torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        out = model(x)
        (F.cross_entropy(out, y) + F.mse_loss(out[:, :1], x[:, :1])).backward()
        opt.step()


def test_every_detector_ships() -> None:
    kinds = {cls.kind for cls in builtin_detectors()}
    assert {"dead_relu", "no_update", "unregistered_parameter", "no_gradient", "missing_zero_grad",
            "exploding_gradient", "vanishing_gradient", "overfitting", "diverging", "plateau",
            "probabilities_as_logits", "loss_broadcast", "unnormalized_input",
            "eval_mode_training"} <= kinds


def test_deferred_steps_add_no_host_reads() -> None:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with count_host_syncs() as bare:
        _steps(model, opt, 12)
    with torch_sentinel.attach(model, opt, check="deferred", flush_every=1000, update_every=5) as s:
        with count_host_syncs() as attached:
            _steps(model, opt, 12)  # steps 0-11: probes, graph walks, pre-step norms, ReLU masks
        assert s.step == 12
    assert attached.count == bare.count, dict(attached.ops)


def test_detach_restores_every_patched_function() -> None:
    names = ("relu", "relu_", "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss",
             "huber_loss", "binary_cross_entropy_with_logits")
    before = {n: getattr(F, n) for n in names}
    before_torch = (torch.relu, torch.relu_)
    model = Net()
    s = torch_sentinel.attach(model, torch.optim.SGD(model.parameters(), lr=0.01))
    assert F.cross_entropy is not before["cross_entropy"]
    s.detach()
    assert {n: getattr(F, n) for n in names} == before
    assert (torch.relu, torch.relu_) == before_torch
    assert "relu" not in torch.Tensor.__dict__


def test_two_sentinels_share_patches_and_unwind_in_any_order() -> None:
    a, b = Net(), Net()
    sa = torch_sentinel.attach(a, torch.optim.SGD(a.parameters(), lr=0.01))
    sb = torch_sentinel.attach(b, torch.optim.SGD(b.parameters(), lr=0.01))
    sa.detach()
    assert "relu" in torch.Tensor.__dict__  # b still listens
    _steps(b, sb.optimizers[0], 2)
    sb.detach()
    assert "relu" not in torch.Tensor.__dict__
