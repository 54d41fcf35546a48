"""The largest attention logit of each attention module, per step, into ledger slots.

No public hook carries q and k: they are made and consumed inside an attention module's
forward. Two ways in, both without touching the user's code:

- ``torch.nn.functional.scaled_dot_product_attention``, observed through the shared function
  patches (``patches.py``): hand-written attention that calls it, Hugging Face models with the
  ``sdpa`` attention implementation (their default), and ``nn.MultiheadAttention`` on its fast
  paths. Which module made the call is known from a forward pre-hook on each attention module
  (it sets the current slot; its forward hook clears it), so calls from other models and from
  outside any attention module are ignored. Under torch.compile the hooks and the wrapper are
  traced (no graph break): the slot is fixed at trace time, which is right, since a call site
  belongs to one module.
  In eager steps the call is only recorded (its queries and keys, which SDPA's backward keeps
  anyway); at the collector's next boundary (the model's forward returns) every recorded call is
  reduced together (``spike_stats.max_attention_logits``: one product and one max for the
  attention modules of one shape). One at a time, between the model's own kernels, which have
  just evicted the code and data the dispatcher walks, each call's product and max cost 60-70
  us on the benchmark GPT, against about 12 alone. A recorded call keeps its q and k (and the
  storage they view) alive until the boundary, which under activation checkpointing would
  otherwise be freed with the block: so a call is held only while what the pending calls keep
  stays under :data:`HOLD_BYTES`, and reduced on the spot beyond it. The saving matters where
  a step is short (small models, where the limit is never reached); a large model's calls are
  reduced as they come, as before.
- ``nn.MultiheadAttention``: its forward pre-hook recomputes the first sequence's q and k from
  the input and its ``in_proj`` weights (it does not call SDPA when ``need_weights=True``, the
  default); the SDPA calls it makes itself are then skipped.

Attention modules are found by type and name: ``nn.MultiheadAttention``, and the innermost
modules whose class name contains "attention" or "attn" (``CausalSelfAttention``,
``LlamaAttention``, ``GPT2Attention``, ``BertSelfAttention``). Attention computed with
``q @ k.transpose(-2, -1)`` (Hugging Face's ``eager`` implementation, nanoGPT's slow path) is not
seen: there is no call to observe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .batch import SlotIndex
from .compat import is_compiling
from .hookset import ModuleHook
from .ledger import Ledger
from .patches import patch_for
from .spike_stats import max_attention_logit, max_attention_logits, mha_max_logit
from .unwatched import functorch_active

__all__ = ["HOLD_BYTES", "AttentionLogits", "attention_modules"]

#: The most bytes of storage the recorded SDPA calls of one forward may keep alive until the
#: boundary (their q and k views keep the whole tensors they view; see the module docstring).
HOLD_BYTES = 8 << 20


def _is_attention(module: nn.Module) -> bool:
    if isinstance(module, nn.MultiheadAttention):
        return True
    name = type(module).__name__.lower()
    return "attention" in name or "attn" in name


def attention_modules(modules: Sequence[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """The innermost attention modules of ``modules`` (see the module docstring)."""
    found = [(n, m) for n, m in modules if _is_attention(m)]
    names = [n for n, _ in found]

    def has_inner(name: str) -> bool:
        prefix = name + "." if name else ""
        return any(other != name and other.startswith(prefix) for other in names)

    return [(n, m) for n, m in found if isinstance(m, nn.MultiheadAttention) or not has_inner(n)]


def _storage_bytes(q: torch.Tensor, k: torch.Tensor) -> int:
    """Bytes of the storages ``q`` and ``k`` view (once when they share one, as a fused qkv
    projection's outputs do); a tensor without a plain storage counts as too large to hold."""
    try:
        sq, sk = q.untyped_storage(), k.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return HOLD_BYTES + 1
    if sq.data_ptr() == sk.data_ptr():
        return int(sq.nbytes())
    return int(sq.nbytes()) + int(sk.nbytes())


def _in_transform() -> bool:
    """Inside ``torch.func`` transforms q and k are functorch wrappers, which cannot be written
    into a slot nor outlive the transform: those calls are skipped, as the collector skips the
    model's calls there. Dynamo traces the hooks and cannot make the query."""
    return not is_compiling() and functorch_active()


class _SdpaListener:
    def __init__(self, owner: AttentionLogits) -> None:
        self.owner = owner

    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.owner.on_sdpa(args, kwargs)

    def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        return None


class AttentionLogits:
    """Writes each attention module's largest logit into its ledger slot (with several forwards
    in a step, the last one's). Module ``i`` writes slot ``start + i`` of ``ledger``, looked up
    at each write (the row is reallocated when a later probe adds a block).

    SDPA calls of eager steps wait for :meth:`flush` (the collector's boundaries: see
    ``ProbeHost.flush_at_boundaries``), which reduces them together; a traced call (torch.compile)
    and an ``nn.MultiheadAttention`` call are reduced on the spot (two launches: the scores and
    their max, written in place)."""

    def __init__(self, modules: Sequence[tuple[str, nn.Module]], ledger: Ledger, start: int) -> None:
        self.modules = list(modules)
        self.ledger = ledger
        self.start = start
        self.current: Optional[int] = None
        self._mha = [isinstance(m, nn.MultiheadAttention) for _, m in self.modules]
        #: Per module, its latest SDPA call of the forward in progress: ``(q, k, scale)``.
        self._pending: dict[int, tuple[torch.Tensor, torch.Tensor, Optional[float]]] = {}
        #: Bytes of storage the pending calls keep alive (a storage counted once per call).
        self._held = 0
        self._index = SlotIndex()

    def install(self, hooks: Any) -> None:
        """Register the pre-hooks and subscribe to SDPA through ``hooks`` (a ``HookSet``:
        everything is removed at detach)."""
        for i, (_, module) in enumerate(self.modules):
            hooks.add(module.register_forward_pre_hook(ModuleHook(self._enter, i), with_kwargs=True))
            hooks.add(module.register_forward_hook(ModuleHook(self._leave), always_call=True))
        hooks.subscribe(patch_for(F, "scaled_dot_product_attention"), _SdpaListener(self))

    def _enter(self, i: int, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.current = i
        if self._mha[i] and torch.is_grad_enabled() and not _in_transform():
            query = args[0] if args else kwargs.get("query")
            key = args[1] if len(args) > 1 else kwargs.get("key")
            if isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor):
                assert isinstance(module, nn.MultiheadAttention)
                self._write(i, lambda out: mha_max_logit(module, query, key, out=out))
        return None

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        self.current = None

    def on_sdpa(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        i = self.current
        if i is None or self._mha[i] or not torch.is_grad_enabled():
            return
        q = args[0] if args else kwargs.get("query")
        k = args[1] if len(args) > 1 else kwargs.get("key")
        if not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor) or not q.is_floating_point():
            return
        scale = kwargs.get("scale")
        if _in_transform():
            return
        if not is_compiling():  # traced calls are reduced on the spot
            held = self._held + _storage_bytes(q, k)
            if held <= HOLD_BYTES:
                self._held = held
                self._pending[i] = (q, k, scale)
                return
            self._pending.pop(i, None)  # past the hold limit: on the spot, and the later call wins
        self._write(i, lambda out: max_attention_logit(q, k, scale, out=out))

    def __len__(self) -> int:
        return len(self._pending)

    def flush(self) -> None:
        """Reduce the recorded calls into their slots (a boundary)."""
        if not self._pending:
            return
        pending, self._pending, self._held = self._pending, {}, 0
        slots = list(pending)
        row = self.ledger.current
        with torch.no_grad():
            for members, maxima in max_attention_logits([pending[i] for i in slots]):
                where = [self.start + slots[m] for m in members]
                row.index_copy_(0, self._index(where, row.device), maxima.to(row.dtype))

    def drop(self) -> None:
        """Forget the recorded calls (an abandoned row, a forward that raised, detach): their
        queries and keys go with them."""
        self._pending, self._held = {}, 0

    def _write(self, i: int, compute: Any) -> None:
        view = self.ledger.views[self.start + i]
        with torch.no_grad():
            value = compute(view)
            if value is not view:  # another dtype than the row's: one copy more
                view.copy_(value)
