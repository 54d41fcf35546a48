"""What each loss function was given: the probe behind the loss contracts (``losses/``).

**Interception.** Every ``torch.nn.functional`` loss with a checked clause is observed through
the shared function patches (``patches.py``): one wrapper per function, installed at the first
``attach()`` and put back at the last ``detach()``; a wrapper another library adds on top, before
or after ours, keeps working (``Patch.ensure``). The ``nn.*Loss`` modules call those same
functions, and so do Hugging Face's ``labels=`` losses and Lightning ``training_step``s, so
one patch per function covers every spelling. Why patches: PyTorch has no public hook on a
functional call. The alternatives were measured (``python -m benchmarks.loss_interception``):

- a global module forward hook (``register_module_forward_hook``) sees only ``nn.*Loss``
  modules, not ``F.*`` calls, and takes every module of the process off ``nn.Module``'s
  hook-free fast path while installed;
- reading the loss's autograd node at ``backward()`` needs no patch, but half the losses are
  composites with no node of their own (``kl_div``, ``l1_loss``, the margin and triplet losses,
  Poisson and Gaussian NLL, class-probability cross-entropy), keywords such as ``log_target``
  and ``log_input`` are gone, saved tensors may sit behind the user's pack hooks (offloaded),
  and nothing there says where the loss was called.

**Sampling.** On steps that are not sampled (``cadence.sampled``: steps 0-4, every 10th to step
100, then every 50th) a call costs the wrapper and a counter. On a sampled step the call's host
facts are read (``losses.calls.describe``: shapes, keywords, the producing op, the call site)
and its figures reduced on the device (``losses.checks``) into a small vector; nothing is read
back.

**Scoping.** A call belongs to this model when it is made inside the model's training forward
(Hugging Face's ``labels=``), or when its input's autograd graph reaches, within
:data:`WALK_NODES` nodes, an output that the model (or one of its top-level children, called
from the loop as Lightning's ``self.net(x)`` is) returned in this step
(``criterion(model(x).squeeze(1), y)``); a loss of another attached model (a GAN's other
network) is not. Under torch.compile, where the outputs are traced rather than seen, every
training call counts. The call's figures are folded into its site's ledger block on the spot
and its facts become a :class:`~torch_sentinel.losses.calls.LossCall` in the step's
:class:`LossCalls`. Only calls whose inputs require grad count.

**Facts.** :class:`LossCalls` (host: each probed call of the step, as a
:class:`~torch_sentinel.losses.calls.LossCall`), :class:`LossFigures` (device: what each call
site's checks left in the row, decoded once it landed) and :class:`CompiledLoss` (the loss
reaching backward came out of a compiled graph, and no watched call was seen outside it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, ClassVar, Optional

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from .._record import Fact, StepRecord
from ..losses import checks
from ..losses.calls import LossCall, call_site, describe
from ..losses.contracts import Contract, by_function, functional_names
from .cadence import sampled
from .compat import is_compiling as _is_compiling
from .ledger import FLOAT_MAX
from .patches import patch_for
from .probe import Probe, ProbeHost

__all__ = ["WATCHED", "CompiledLoss", "LossCalls", "LossFigures", "LossInputs"]

#: The functional losses observed (those with a clause to check).
WATCHED = functional_names()
_PROB_MODULES = (nn.Softmax, nn.Sigmoid, nn.Softmax2d, nn.LogSoftmax)
#: Distinct (loss, call site) pairs given ledger slots; later ones are judged on host facts only.
MAX_SITES = 16
#: Calls kept per step (a loss called in a long inner loop keeps the first ones).
MAX_CALLS = 64
#: Model outputs of one step kept to scope loss calls (a loop of many forwards keeps the newest).
MAX_OUTPUTS = 64
#: Nodes of a loss input's graph searched for the model's outputs, from the input down.
WALK_NODES = 64


@dataclasses.dataclass(frozen=True)
class LossCalls(Fact):
    """This model's loss calls on a probed step, oldest first (host facts)."""

    calls: tuple[LossCall, ...]

    @property
    def classes(self) -> Optional[int]:
        """The class count the latest cross_entropy / nll_loss call read, if any."""
        for call in reversed(self.calls):
            if call.loss in ("cross_entropy", "nll_loss") and call.class_dim is not None:
                return int(call.input_shape[call.class_dim])
        return None


@dataclasses.dataclass(frozen=True)
class LossFigures(Fact):
    """The clause figures in this step's row: per ledger block (one per call site), each figure
    of the block's layout, None where no call of the step measured it. The calls of one site in
    one step share their block (folded: the extreme of each figure)."""

    blocks: tuple[tuple[str, tuple[tuple[str, Optional[float]], ...]], ...]

    def of(self, block: str) -> dict[str, Optional[float]]:
        for name, figures in self.blocks:
            if name == block:
                return dict(figures)
        return {}


@dataclasses.dataclass(frozen=True)
class CompiledLoss(Fact):
    """The loss reaching backward was a compiled graph's output, and no watched loss function
    had been seen outside compiled code so far: the loss is computed inside compiled code."""


def _figures(record: StepRecord) -> Optional[LossFigures]:
    """Decode :class:`LossFigures` from a landed row: the blocks the step's calls wrote, each
    figure signed back (minimum figures were stored negated, see ``LossInputs._vector``)."""
    calls = record.fact(LossCalls)
    if calls is None or LossFigures not in record.meta.in_row:
        return None
    out = []
    for block in dict.fromkeys(c.block for c in calls.calls if c.block):
        if not record.has(block) or record.blocks[block].stop > len(record.values):
            continue
        b = record.blocks[block]
        figs = []
        for i, name in enumerate(b.keys):
            raw = float(record.values[b.start + i])
            figs.append((name, None if raw <= -0.5 * FLOAT_MAX else (-raw if checks.folds_by_min(name) else raw)))
        out.append((block, tuple(figs)))
    return LossFigures(tuple(out))


class _Listener:
    def __init__(self, owner: LossInputs, contract: Contract, fn: Any) -> None:
        self.owner = owner
        self.contract = contract
        self.fn = fn

    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.owner.before_loss(self.contract, self.fn, args, kwargs)

    def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        return None


class LossInputs(Probe):
    """What this model's loss calls were given (one per sentinel, set up for every reader of its
    facts)."""

    name = "loss_inputs"
    publishes = (LossCalls, LossFigures, CompiledLoss)
    live_attributes: ClassVar[frozenset[str]] = frozenset(
        {"probe_first", "probe_every", "_prob_outputs", "_sites", "_outputs", "_in_forward", "_constants",
         "_names", "_children"})

    def __init__(self, probe_first: int = 5, probe_every: int = 10) -> None:
        self.probe_first = probe_first
        self.probe_every = probe_every
        self.host: Optional[ProbeHost] = None
        self._prob_outputs: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._sites: dict[tuple[str, str], str] = {}
        #: The autograd nodes of the outputs the model returned in this step (sampled steps only).
        self._outputs: list[Any] = []
        self._in_forward = False
        self._constants: dict[tuple[str, torch.device], tuple[torch.Tensor, list[torch.Tensor]]] = {}
        self._names: dict[int, str] = {}
        self._children: set[int] = set()
        #: Training calls of the watched loss functions seen outside compiled code.
        self._eager_calls = 0

    def setup(self, host: ProbeHost) -> None:
        self.host = host
        F = torch.nn.functional
        for name in WATCHED:
            contract = by_function(name)
            if contract is not None and hasattr(F, name):
                host.hooks.subscribe(patch_for(F, name), _Listener(self, contract, getattr(F, name)))
        self._names = {id(m): name for name, m in host.map.modules}
        self._children = {id(m) for name, m in host.map.modules if name and "." not in name}
        host.provide(LossFigures, _figures)

    # -- which module made a loss input (the model's output, or a Softmax/Sigmoid module) --
    def output_modules(self, host: ProbeHost) -> Iterable[nn.Module]:
        # the model and its top-level children: a loop may call those itself (Lightning's
        # ``self.net(x)`` in training_step); and Softmax/Sigmoid modules, to name a producer
        return [m for name, m in host.map.modules
                if isinstance(m, _PROB_MODULES) or m is host.map.root or (name and "." not in name)]

    def due(self, step: int) -> bool:
        """The producers are needed on the steps whose loss inputs are probed."""
        return sampled(step, self.probe_first, self.probe_every)

    def on_root_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._in_forward = True

    def on_output(self, slot: int, module: nn.Module, args: Any, t: torch.Tensor, compiling: bool) -> None:
        if compiling:
            return
        if slot == 0:
            self._in_forward = False
        if (slot == 0 or (not self._in_forward and id(module) in self._children)) and t.grad_fn is not None \
                and len(self._outputs) < MAX_OUTPUTS:
            self._outputs.append(t.grad_fn)
        if t not in self._prob_outputs:  # else an inner probability module made it: it is the producer
            self._prob_outputs[t] = (self._names.get(id(module), ""), isinstance(module, _PROB_MODULES))

    def _ours(self, tensors: Iterable[Any]) -> bool:
        """Whether a loss call on ``tensors`` belongs to this model (see the module docstring)."""
        host = self.host
        if self._in_forward or host is None or host.traced:
            return True
        wanted = {id(n) for n in self._outputs}
        return any(isinstance(t, torch.Tensor) and t.grad_fn is not None and _reaches(t.grad_fn, wanted)
                   for t in tensors)

    # -- the calls ------------------------------------------------------------------------
    def before_loss(self, contract: Contract, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        c = self.host
        if c is None or _is_compiling() or not torch.is_grad_enabled():
            return
        self._eager_calls += 1
        if not self.due(c.step):
            return
        described = describe(contract, fn, args, kwargs)
        if described is None or not self._ours(described.inputs):
            return
        facts = described.facts
        site = call_site(1)
        block, names = self._block(contract, site)
        x = described.tensors["input"]
        got: dict[str, torch.Tensor] = {}
        if names and x.device == c.device:
            with torch.no_grad():
                got = checks.figures(contract, described.tensors, described.dims, described.extra)
                if got:
                    b = c.ledger.blocks[block]
                    view = c.ledger.current[b.start : b.stop]
                    torch.maximum(view, self._vector(contract, names, got), out=view)
                    c.mark_in_row(LossFigures)
        producer = self._prob_outputs.get(x)
        call = LossCall(step=c.step, site=site, block=block if got else "",
                        module=producer[0] if producer is not None else None,
                        measured=tuple(n for n in names if n in got), **facts)
        seen = c.meta.facts.get(LossCalls)
        earlier = seen.calls if isinstance(seen, LossCalls) else ()
        if len(earlier) < MAX_CALLS:
            c.publish(LossCalls((*earlier, call)))

    def _block(self, contract: Contract, site: str) -> tuple[str, tuple[str, ...]]:
        """The ledger block of ``(loss, site)``, added the first time it is seen (cold path)."""
        names = checks.layout(contract)
        if not names or self.host is None:
            return "", ()
        key = (contract.name, site)
        block = self._sites.get(key)
        if block is None:
            if len(self._sites) >= MAX_SITES:
                return "", ()
            block = self._sites[key] = f"loss_contract.{len(self._sites)}"
            self.host.ledger.add_block(block, list(names), -FLOAT_MAX)
        return block, names

    def _vector(self, contract: Contract, names: tuple[str, ...], got: dict[str, torch.Tensor]) -> torch.Tensor:
        """The figures in block order, each signed so that one ``maximum`` folds it (minimum
        figures negated); a figure not measured holds the block's initial value."""
        assert self.host is not None
        device = self.host.device
        key = (contract.name, device)
        if key not in self._constants:
            signs = [-1.0 if checks.folds_by_min(n) else 1.0 for n in names]
            unset = [torch.tensor(-FLOAT_MAX * s, device=device) for s in signs]
            self._constants[key] = (torch.tensor(signs, device=device), unset)
        sign, unset = self._constants[key]
        items = [got[n].reshape(()).to(torch.float32) if n in got else unset[i] for i, n in enumerate(names)]
        return torch.stack(items).mul_(sign)

    def on_backward(self, loss: torch.Tensor) -> None:
        # Made by a compiled graph (aot_autograd's node), with no watched loss function seen
        # outside it: the loss was computed inside compiled code (HF's ``labels=``, nanoGPT's
        # ``forward(idx, targets)`` under torch.compile), where those calls are traced, not seen.
        if self.host is not None and self._eager_calls == 0 \
                and type(loss.grad_fn).__name__.startswith("CompiledFunction"):
            self.host.publish(CompiledLoss())

    def on_row_close(self, meta: Any) -> None:
        self._outputs = []  # the step's graph: not held past its step
        self._in_forward = False

    def close(self) -> None:
        self.host = None
        self._outputs = []
        self._constants = {}


def _reaches(root: Any, wanted: set[int]) -> bool:
    """Whether one of the ``wanted`` autograd nodes (by id, alive while compared) lies within
    :data:`WALK_NODES` nodes of ``root``, breadth first: a loss input sits a few nodes from
    the model's output it was made of."""
    seen: set[int] = set()
    frontier = [root]
    while frontier and len(seen) < WALK_NODES:
        nxt: list[Any] = []
        for node in frontier:
            if node is None or id(node) in seen:
                continue
            if id(node) in wanted:
                return True
            seen.add(id(node))
            nxt.extend(n for n, _ in node.next_functions)
        frontier = nxt
    return False
