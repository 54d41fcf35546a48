"""Proof that the hooks actually ran: torch.compile can silently skip them.

With the default ``torch._dynamo.config.skip_nnmodule_hook_guards=True``, compiled code does not
guard on a module's hook dicts. Measured on torch 2.13, hooks then never run in two cases:

- they were added after the model's first compiled call (the cached graph has no hooks);
- another, hook-less instance of the same class was compiled earlier in the process (the cache
  entry of the shared ``forward`` code is reused).

Nothing fails: the sentinel would simply watch with blind eyes. So the first steps are checked
on the host, from the landed rows alone: a step whose optimizer saw gradients but whose batch
and module outputs never reached a slot means the forward hooks did not run. The fix is to drop
the compiled code of this model only, logged, so that its next call recompiles with the hooks
in place: dynamo keeps its cache on each code object, and ``torch.compile(model)`` compiles the
frame of the model class's own ``forward`` (of a dynamo wrapper for a ``torch.nn`` container,
of ``Module._call_impl`` after ``model.compile()``), so resetting those code objects' caches
drops what this model runs and nothing else (other instances of the same class recompile once
too). Every other compiled function in the process keeps its code: dynamo is never reset
process-wide. If no compiled code of the model is found (a compiled training-step function
holds it), if the hooks are still silent after the reset, or when resetting is not wanted,
:class:`InstrumentationError` says how to attach correctly.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Iterable, Sequence
from typing import Any, Optional

import numpy as np
from torch import nn

from ._collect.collector import Collector
from ._collect.compat import (
    CALL_IMPL_CODE,
    compiled_entries,
    compiled_in_place,
    drop_compiled,
    inline_wrapper_code,
)
from ._collect.ledger import FLOAT_MAX
from ._collect.transfer import AsyncFetch
from ._errors import InstrumentationError, format_message
from ._findings import BOUNDARIES
from ._record import StepRecord
from ._record.fault import Fault
from .detectors.nonfinite import locate

__all__ = ["BLIND_HOOK_POLICIES", "HookLiveness", "first_fault_in_row"]

logger = logging.getLogger("torch_sentinel")

#: What to do when the hooks are found silent: recompile with them, or raise.
BLIND_HOOK_POLICIES = ("reset", "raise")


def model_codes(modules: Iterable[nn.Module]) -> list[types.CodeType]:
    """The code objects holding compiled code that this model's calls run through.

    ``torch.compile(model)`` runs the root's hooks eagerly and compiles the frame of its class's
    ``forward`` (a graph break gives a submodule's ``forward`` a frame of its own); a root that
    is a ``torch.nn`` class is compiled through dynamo's ``wrap_inline`` wrapper, and
    ``model.compile()`` compiles ``Module._call_impl``. Only code objects with cache entries count.
    """
    mods = list(modules)
    candidates: list[types.CodeType] = []
    for m in mods:
        code = getattr(getattr(type(m), "forward", None), "__code__", None)
        if isinstance(code, types.CodeType) and not type(m).__module__.startswith("torch."):
            candidates.append(code)
    if mods:
        wrapper = inline_wrapper_code(mods[0])
        if wrapper is not None:
            candidates.append(wrapper)
        if compiled_in_place(mods[0]):
            candidates.append(CALL_IMPL_CODE)
    found: list[types.CodeType] = []
    for code in candidates:
        if code not in found and compiled_entries(code):
            found.append(code)
    return found


def _reset_codes(codes: Sequence[types.CodeType]) -> bool:
    """Drop dynamo's compiled code for these code objects only (their next call recompiles)."""
    return all([drop_compiled(code) for code in codes])


class HookLiveness:
    """Watches the first ``probe_steps`` steps that had gradients; settles once hooks are seen."""

    def __init__(self, model_name: str, owner_slots: Sequence[int], policy: str = "reset",
                 probe_steps: int = 2, modules: Sequence[nn.Module] = ()) -> None:
        if policy not in BLIND_HOOK_POLICIES:
            raise ValueError(f"blind_hooks={policy!r} is not valid: expected one of {BLIND_HOOK_POLICIES}")
        self.model_name = model_name
        #: Module slot of each parameter's owner (0, the root, for its own parameters).
        self._owners = np.asarray(owner_slots, dtype=np.int64)
        self.policy = policy
        self.probe_steps = probe_steps
        self.proven = False
        self.reset_at: Optional[int] = None
        self._blind: list[int] = []
        self._modules = list(modules)
        #: ``file:line (name)`` of each code object whose compiled code was dropped.
        self.reset_codes: list[str] = []

    @classmethod
    def for_collector(cls, collector: Collector, param_owner: dict[str, str], model_name: str,
                      policy: str) -> HookLiveness:
        slot = {name: i for i, name in enumerate(collector.module_names)}
        owners = [slot.get(param_owner.get(name, ""), 0) for name, _ in collector.params]
        return cls(model_name, owners, policy, modules=[m for _, m in collector.map.modules])

    @property
    def settled(self) -> bool:
        return self.proven

    def observe(self, record: StepRecord, current_step: int) -> None:
        """``current_step`` is the collector's step in progress (rows lag it in deferred mode)."""
        if self.proven:
            return
        if self.reset_at is not None and record.step < self.reset_at:
            return  # ran before the reset took effect
        grads = record.array("grad_norm")
        if not (grads.size and np.any(grads != 0)):
            return  # no gradients (or no parameters): the step proves nothing either way
        if _hooks_reached(record, self._owners[grads != 0] if self._owners.size == grads.size else None):
            self.proven = True
            if self.reset_at is not None:
                logger.warning("torch_sentinel: hooks confirmed running after the reset (step %d)", record.step)
            return
        self._blind.append(record.step)
        if len(self._blind) < self.probe_steps and self.reset_at is None:
            return
        codes = model_codes(self._modules) if self.reset_at is None and self.policy == "reset" else []
        if codes and _reset_codes(codes):
            self.reset_codes = [f"{c.co_filename}:{c.co_firstlineno} ({c.co_name})" for c in codes]
            logger.warning(
                "torch_sentinel: the forward hooks on %s did not run during steps %s although the "
                "optimizer saw gradients: torch.compile reused code compiled without them "
                "(skip_nnmodule_hook_guards). Dropping the compiled code of this model only (%s) "
                "so its next call recompiles with the hooks; every other compiled function keeps "
                "its code. To avoid the recompile, attach before the first compiled call.",
                self.model_name, self._blind, ", ".join(self.reset_codes),
            )
            self.reset_at = current_step + 1
            self._blind = []
            return
        raise InstrumentationError(self._message())

    def _message(self) -> str:
        steps = ", ".join(str(s) for s in self._blind)
        after = " even after dropping the model's compiled code" if self.reset_at is not None else ""
        return format_message(
            f"torch_sentinel's forward hooks on {self.model_name} never ran{after}: "
            "it would be watching with blind eyes",
            expected="the batch and every module's output recorded at each training step",
            arrived=f"optimizer steps {steps} had gradients but no forward evidence at all",
            where=f"{self.model_name}, steps {steps}",
            next_check=(
                "attach before the model's first compiled call (sentinel = attach(model, opt); "
                "then model = torch.compile(model)), or compile a fresh model after attaching; "
                "hooks added after compilation, or a hook-less instance of the same class compiled "
                "earlier, are skipped under torch._dynamo.config.skip_nnmodule_hook_guards=True "
                "(setting it to False also works). When a compiled training-step function holds "
                "the model, recompile it after attaching (torch._dynamo.reset() drops every compiled "
                "function in the process: the sentinel never calls it). Call the model as "
                "model(x), not model.forward(x), which bypasses all hooks."
            ),
        )


def _hooks_reached(record: StepRecord, owners: Optional[np.ndarray]) -> bool:
    """Did the forward hooks run in this row? Untouched min slots hold FLOAT_MAX.

    The modules owning parameters that received gradients must have run forward. Only their
    slots count: under ``torch.compile(model)`` the root's own hooks run outside the compiled
    ``forward`` and stay alive while every submodule's hooks are skipped. One live owner is
    enough (a parameter used functionally by its parent never passes its own module).
    """
    act = record.array("act.min")
    untouched = np.float32(FLOAT_MAX)
    children = owners[owners != 0] if owners is not None else np.empty(0, dtype=np.int64)
    if children.size:
        return bool(np.any(act[np.unique(children)] != untouched))
    data = record.array("data.min")
    return bool(np.any(act != untouched) or np.any(data != untouched))


def first_fault_in_row(collector: Collector, ctx: Any, core_width: int, fault: Fault) -> Fault:
    """The earliest rung of the current row that is non-finite, if earlier than ``fault``'s.

    Hooks traced into compiled code still write their slots but skip their host checks, so
    under torch.compile the first immediate check to fire is the loss capture, outside the
    graph, even when the batch or a module output went bad first. The row knows better. Cold
    path: runs once, on a fault, and reads the row through the audited transfer.
    """
    if fault.boundary in ("data", "shapes"):
        return fault
    values = AsyncFetch([collector.ledger.current]).result(block=True)
    assert values is not None
    row = StepRecord(collector.meta, values[0], collector.ledger.blocks)
    earlier = locate(row, ctx, core_width)
    if earlier is not None and (earlier.step, BOUNDARIES.index(earlier.boundary)) < (
        fault.step, BOUNDARIES.index(fault.boundary)
    ):
        return earlier  # (a weight fault belongs to the previous step, and stays first)
    return fault
