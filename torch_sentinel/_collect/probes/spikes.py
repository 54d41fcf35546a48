"""Device evidence for loss-spike forensics (the ``loss_spike`` detector's probe).

Two places, by what each figure needs:

- the spike ring (``spike_ring.py``): per parameter, the update and weight norms and the
  sum of ``exp_avg_sq`` of the last K steps, written at the optimizer's pre- and post-step and
  read on the host only when a spike is seen (cold path);
- the step's ledger row, which reaches the host every step anyway: each attention module's
  largest logit (``spike_attn``), the output logits' log-sum-exp (``spike_out``) and the
  largest integer input, a token id (``spike_input``). These are written from forward hooks, which
  torch.compile traces: a row's slots are fixed tensors, where a ring row indexed by the step
  would be a Python int baked into the graph (and a recompile at every step).

The output logits are the model's output: a floating tensor of the root's output whose last dim
is the vocabulary (the ``num_embeddings`` of its largest ``nn.Embedding``), after whatever the
root does past its head (a temperature, Gemma's soft-capping). When the root returns its head's
output as it is, the collector delivers that tensor once, to the head (the model's last
``Linear`` with the vocabulary as ``out_features``): the head's delivery takes it then, and the
root's is skipped. Two launches per step (log-sum-exp, mean into the slot), four when the root
transforms its head's output; the id's two (max, copy into the slot).
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Iterable
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from ..._record import Fact, StepRecord
from ..attention_logits import AttentionLogits, attention_modules
from ..ledger import FLOAT_MAX
from ..probe import Probe, ProbeHost
from ..spike_ring import RingLayout, SpikeRing, unit_layout
from ..spike_stats import mean_logsumexp
from ..tensors import materialized

__all__ = ["SPIKE_ATTN", "SPIKE_INPUT", "SPIKE_OUT", "SpikeForward", "SpikeProbe"]

SPIKE_ATTN = "spike_attn"
SPIKE_OUT = "spike_out"
SPIKE_INPUT = "spike_input"


@dataclasses.dataclass(frozen=True)
class SpikeForward(Fact):
    """The forward's figures of one step for the spike forensics (nan where not seen): each
    attention module's largest logit (in the order of ``SpikeProbe.layout.attention``), the
    output logits' log-sum-exp, and the largest integer input (a token id)."""

    attention: np.ndarray
    output_lse: float
    ids_max: float


def _slot(value: float) -> float:
    """A row slot as a number: the untouched initial values (+-float32 max) are nan."""
    return value if math.isfinite(value) and abs(value) < FLOAT_MAX else math.nan


def _forward_figures(record: StepRecord) -> Optional[SpikeForward]:
    """Decoded for every record the loss-spike detector keeps: plain floats, and numpy only
    where there are attention modules."""
    if not record.has(SPIKE_INPUT):
        return None
    attention = np.zeros(0)
    if record.has(SPIKE_ATTN):
        attention = record.array(SPIKE_ATTN).astype(np.float64)
        attention[np.abs(attention) >= FLOAT_MAX] = np.nan
    lse = _slot(record.value(SPIKE_OUT, "lse")) if record.has(SPIKE_OUT) else float("nan")
    return SpikeForward(attention, lse, _slot(record.value(SPIKE_INPUT, "ids_max")))


def lr_keys(optimizers: list[torch.optim.Optimizer]) -> dict[int, str]:
    """id(param) -> its param group's key in ``StepMeta.lr_names`` (as ``StepProbe`` names them)."""
    keys: dict[int, str] = {}
    for k, opt in enumerate(optimizers):
        for i, group in enumerate(opt.param_groups):
            name = str(group.get("name", f"group{i}"))
            key = name if len(optimizers) == 1 else f"opt{k}.{name}"
            for p in group["params"]:
                keys.setdefault(id(p), key)
    return keys


class SpikeProbe(Probe):
    name = "spikes"
    publishes = (SpikeForward,)
    live_attributes = frozenset({"host", "ring", "layout", "_heads", "_attention", "_head_output"})

    def __init__(self, steps: int = 32) -> None:
        self.steps = steps
        self.ring: Optional[SpikeRing] = None
        #: Filled at setup: which parameter each ring column holds, and the units.
        self.layout: Optional[RingLayout] = None
        self.vocab = 0
        self._heads: list[nn.Module] = []
        #: Ledger slots (looked up at each write: a later probe's block may reallocate the row).
        self._lse: Optional[int] = None
        self._ids: Optional[int] = None
        self._attention: Optional[AttentionLogits] = None
        #: The head's latest output (weakly: the logits must not outlive their step).
        self._head_output: Optional[weakref.ref[torch.Tensor]] = None

    def setup(self, host: ProbeHost) -> None:
        self.host = host
        modules = host.map.modules
        embeddings = [m.num_embeddings for _, m in modules if isinstance(m, nn.Embedding)]
        self.vocab = max(embeddings) if embeddings else 0
        heads = [(n, m) for n, m in modules if self.vocab and isinstance(m, nn.Linear) and m.out_features == self.vocab]
        self._heads = [heads[-1][1]] if heads else []
        output = heads[-1][0] if heads else ("" if self.vocab else None)
        attention = attention_modules(modules)
        ledger = host.ledger
        if attention:
            block = ledger.add_block(SPIKE_ATTN, [n for n, _ in attention], -FLOAT_MAX)
            self._attention = AttentionLogits(attention, ledger, block.start)
            self._attention.install(host.hooks)
            host.flush_at_boundaries(self._attention)
        if self.vocab:
            self._lse = ledger.add_block(SPIKE_OUT, ["lse"], -FLOAT_MAX).start
        self._ids = ledger.add_block(SPIKE_INPUT, ["ids_max"], -FLOAT_MAX).start
        host.provide(SpikeForward, _forward_figures)
        if host.sharded:
            return  # local shards' norms are not the parameters' (see README Limitations)
        self.ring = SpikeRing(host.device, host.optimizers, host.param_tensors, self.steps)
        names = {id(p): n for n, p in host.params}
        keys = lr_keys(host.optimizers)
        cols = self.ring.columns
        param_names = [names[id(p)] for p in cols]
        self.layout = unit_layout(
            param_names,
            [host.map.param_owner.get(n, n.rpartition(".")[0]) for n in param_names],
            [keys.get(id(p)) for p in cols],
            [p.numel() if materialized(p) else 0 for p in cols],
            [n for n, _ in attention],
            output,
        )

    def output_modules(self, host: ProbeHost) -> Iterable[nn.Module]:
        return [host.map.root, *self._heads] if self.vocab else ()

    def on_root_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = next((a for a in args if isinstance(a, torch.Tensor)), kwargs.get("input_ids"))
        if self._ids is None or not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex():
            return
        if ids.numel() == 0 or ids.dtype is torch.bool:
            return
        # Integer ids never require grad: no detach (one op a step saved).
        self.host.ledger.views[self._ids].copy_(ids.amax())

    def on_output(self, slot: int, module: nn.Module, args: Any, t: torch.Tensor, compiling: bool) -> None:
        if self._lse is None or not t.is_floating_point() or t.dim() < 2 or t.shape[-1] != self.vocab:
            return
        if slot == 0:
            head = self._head_output() if self._head_output is not None else None
            self._head_output = None
            if head is t:
                return  # the head's output, returned as it is: already taken
        elif compiling:
            return  # traced, the root's output is always delivered: it alone is taken
        else:
            self._head_output = weakref.ref(t)
        view = self.host.ledger.views[self._lse]
        with torch.no_grad():
            value = mean_logsumexp(t, out=view)
            if value is not view:
                view.copy_(value)

    def on_pre_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.ring is not None and optimizer is not None:
            self.ring.before_update(optimizer, self.host.step)

    def on_post_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.ring is not None and optimizer is not None:
            self.ring.after_update(optimizer, self.host.step)

    def weights_moved(self, step: int) -> list[tuple[str, float, float]]:
        """``(parameter, norm after the last update, norm now)`` of each weight whose norm changed
        2x or more (or went non-finite) between the optimizer's step ``step - 1`` and now, with no
        optimizer step in between (cold path: see :meth:`SpikeRing.weights_moved`)."""
        if self.ring is None or self.layout is None:
            return []
        return [(self.layout.params[c], a, b) for c, a, b in self.ring.weights_moved(step)]

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
