"""The largest attention logit of each attention module (the loss-spike forensics' evidence).

In eager steps an SDPA call is only recorded; the collector's next boundary reduces every
recorded call together, attention modules of one shape as one product and one max. The values
reach the step's row whatever the check mode (the batched reduction itself is checked against
one call at a time in ``test_spike_stats.py``), and a forward that raises takes its recorded
queries and keys with it.
"""

from __future__ import annotations

import gc
import math
import warnings
import weakref
from typing import Any, Optional

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_sentinel


class Attention(nn.Module):
    """Self-attention through ``F.scaled_dot_product_attention``; keeps the first sequence's
    queries and keys of its last training forward, for the test to compute the logit itself.
    ``fail`` raises right after the SDPA call (a forward that dies past the attention)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.fail = False
        self.seen: Optional[tuple[torch.Tensor, torch.Tensor]] = None
        self.last_q: Optional[weakref.ref[torch.Tensor]] = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        self.seen = (q[0].detach().clone(), k[0].detach().clone())
        self.last_q = weakref.ref(q)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if self.fail:
            raise ValueError("a forward that dies after its attention")
        return y.transpose(1, 2).reshape(b, t, d)


class Net(nn.Module):
    """Two attention modules of one shape and one with another head count: two groups."""

    def __init__(self) -> None:
        super().__init__()
        self.a0 = Attention(16, 4)
        self.a1 = Attention(16, 4)
        self.a2 = Attention(16, 2)
        self.out = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.a2(self.a1(self.a0(x))))


def _expected(module: Attention) -> float:
    assert module.seen is not None
    q, k = module.seen
    return float((q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).max())


def _slots(sentinel: torch_sentinel.Sentinel, step: int) -> dict[str, float]:
    sentinel.flush()
    rec = next(r for r in sentinel.recent_records() if r.step == step)
    return dict(zip(rec.keys("spike_attn"), rec.array("spike_attn").tolist()))


@pytest.mark.parametrize("check", ["immediate", "deferred"])
def test_each_module_gets_its_own_largest_logit_of_the_step(check: str) -> None:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sentinel = torch_sentinel.attach(model, opt, check=check)
    try:
        expected = []
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(2, 6, 16)).pow(2).mean().backward()
            expected.append({name: _expected(getattr(model, name)) for name in ("a0", "a1", "a2")})
            opt.step()
        for step in range(3):
            got = _slots(sentinel, step)
            assert got == pytest.approx(expected[step], rel=1e-6), f"step {step}"
    finally:
        sentinel.detach(quiet=True)


def test_a_forward_that_raises_takes_its_recorded_queries_with_it() -> None:
    """The recorded calls wait for the end of the forward; a forward that dies first drops them
    (none of its queries stays alive), and the next forward's logits are the ones written."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sentinel = torch_sentinel.attach(model, opt, check="deferred")
    try:
        model.a1.fail = True
        with pytest.raises(ValueError, match="dies after its attention"):
            model(torch.full((2, 6, 16), 3.0))
        gc.collect()
        dead: list[Any] = [model.a0.last_q, model.a1.last_q]
        assert all(ref is not None and ref() is None for ref in dead), "the failed forward's queries are still held"

        model.a1.fail = False
        opt.zero_grad()
        model(torch.randn(2, 6, 16)).pow(2).mean().backward()
        expected = {name: _expected(getattr(model, name)) for name in ("a0", "a1", "a2")}
        opt.step()
        assert _slots(sentinel, 0) == pytest.approx(expected, rel=1e-6)
    finally:
        sentinel.detach(quiet=True)


def test_calls_inside_torch_func_transforms_are_skipped_quietly(caplog: pytest.LogCaptureFixture) -> None:
    """Under ``torch.func.grad`` and ``vmap`` q and k are functorch wrappers: nothing is recorded (nothing
    could be written, and nothing may outlive the transform), no listener fails, and the
    training step after it still has its logits."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 6, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sentinel = torch_sentinel.attach(model, opt, check="deferred")
        try:
            params = {k: v.detach() for k, v in model.named_parameters()}
            grads = torch.func.grad(lambda p: torch.func.functional_call(model, p, (x,)).pow(2).mean())(params)
            assert grads["a0.qkv.weight"].shape == model.a0.qkv.weight.shape

            def loss(p: dict[str, torch.Tensor], xi: torch.Tensor) -> torch.Tensor:
                return torch.func.functional_call(model, p, (xi[None],)).pow(2).mean()

            per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x)
            assert per_sample["a0.qkv.weight"].shape == (2, *model.a0.qkv.weight.shape)
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            expected = {name: _expected(getattr(model, name)) for name in ("a0", "a1", "a2")}
            opt.step()
            slots = _slots(sentinel, 0)
        finally:
            sentinel.detach(quiet=True)
    said = [str(w.message) for w in caught if "torch_sentinel" in str(w.message)] + caplog.messages
    assert not [m for m in said if "fail" in m], said
    assert slots == pytest.approx(expected, rel=1e-6)


class Checkpointed(Net):
    """``Net`` with each attention module under non-reentrant activation checkpointing: a block's
    q and k die with the block unless something holds them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in (self.a0, self.a1, self.a2):
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
        return self.out(x)


@pytest.mark.parametrize("limit", ["default", "tiny"], ids=["held-until-the-boundary", "over-the-hold-limit"])
def test_calls_are_held_only_up_to_the_hold_limit(limit: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A recorded call keeps its q and k (and the storage they view) alive until the end of the
    forward; past ``HOLD_BYTES`` of them a call is reduced on the spot instead, so that what
    checkpointing frees stays freed. The logits are the same either way."""
    from torch_sentinel._collect import attention_logits

    if limit == "tiny":
        monkeypatch.setattr(attention_logits, "HOLD_BYTES", 1024)  # this model's qkv: 2 x 6 x 48 floats
    torch.manual_seed(0)
    model = Checkpointed()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    alive_at_the_end: list[bool] = []
    model.out.register_forward_hook(lambda m, a, o: alive_at_the_end.append(
        model.a0.last_q is not None and model.a0.last_q() is not None))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sentinel = torch_sentinel.attach(model, opt, check="deferred")
    try:
        opt.zero_grad()
        model(torch.randn(2, 6, 16)).pow(2).mean().backward()
        expected = {name: _expected(getattr(model, name)) for name in ("a0", "a1", "a2")}
        opt.step()
        got = _slots(sentinel, 0)
    finally:
        sentinel.detach(quiet=True)
    assert alive_at_the_end[0] == (limit == "default")  # the first block's q, inside the forward
    assert got == pytest.approx(expected, rel=1e-6)
