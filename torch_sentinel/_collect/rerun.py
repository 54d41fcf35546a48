"""Run the step's forward again, on the cold path, to localise what the hot path only detected.

On ordinary steps the collector watches the model's outputs, not every module (see
``watching.py``). When those show something wrong (a non-finite output, an exception), the
forward is run a second time with every module watched: same inputs (the tensors the root's
pre-hook kept references to for the duration of the forward, or copies of them; a forward that
changed them in place sees them as it left them), same RNG state (captured at the root's entry),
same weights (the optimizer has not stepped yet), under ``no_grad`` (the user's graph of the
first run is still alive; a second graph would double the activation memory).

The first run's tensors are not written: the RNG state continues from where the first run left
it, and the rerun works on copies of the buffers (BatchNorm's running statistics, counters) and,
where the step goes on (``copy_inputs``), of the input tensors. Writing them, even with their own
values, bumps their version counters, and the first run's graph saves some of them for its
backward (BatchNorm its running statistics; a linear layer an input the forward cleaned in
place): with ``on_nonfinite="warn"`` or ``"record"`` the loop's ``backward()`` would then fail.
Python attributes a forward changes on itself (a call counter, a KV cache), and objects other
than tensors that it is passed and changes, are not restored: the rerun repeats those changes;
it is the cold path of a step that already failed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Optional

import torch
from torch import nn

__all__ = ["RngState", "capture_rng", "rerun_forward"]

#: The torch RNG states a forward draws from: the CPU generator and the model's device's.
RngState = tuple[torch.Tensor, Optional[torch.Tensor]]


def _device_module(device: torch.device) -> Any:
    if device.type == "cpu":
        return None
    module = getattr(torch, device.type, None)
    if module is None or not hasattr(module, "get_rng_state") or not module.is_available():
        return None
    return module


def capture_rng(device: torch.device) -> RngState:
    """The CPU generator's state and the device generator's (host copies; no device read:
    a CUDA generator's state is its seed and offset, kept on the host)."""
    module = _device_module(device)
    return torch.get_rng_state(), (module.get_rng_state(device) if module is not None else None)


def _restore_rng(device: torch.device, state: RngState) -> None:
    torch.set_rng_state(state[0])
    module = _device_module(device)
    if module is not None and state[1] is not None:
        module.set_rng_state(state[1], device)


@contextlib.contextmanager
def _buffers_aside(root: nn.Module) -> Iterator[None]:
    """Every buffer replaced by a copy for the duration (one copy per tensor, so buffers shared
    between modules stay shared), the original tensors put back afterwards, unwritten: the
    first run's graph may have saved them, at their current version, for its backward."""
    swapped: list[tuple[nn.Module, str, torch.Tensor]] = []
    copies: dict[int, torch.Tensor] = {}
    try:
        with torch.no_grad():
            for module in root.modules():
                for name, b in list(module.named_buffers(recurse=False)):
                    if b.device.type == "meta":
                        continue
                    copy = copies.get(id(b))
                    if copy is None:
                        copy = copies[id(b)] = b.clone()
                    setattr(module, name, copy)
                    swapped.append((module, name, b))
        yield
    finally:
        for module, name, b in reversed(swapped):
            setattr(module, name, b)


def _copied(value: Any, memo: dict[int, torch.Tensor]) -> Any:
    """``value`` with every tensor in it (in plain tuples, lists and dicts) replaced by a copy,
    one per tensor (``model(x, x)`` gets one tensor twice, as before): a forward that changes
    its inputs in place (``x.nan_to_num_()``) changes the copies."""
    if isinstance(value, torch.Tensor):
        copy = memo.get(id(value))
        if copy is None:
            copy = memo[id(value)] = value.detach().clone()
        return copy
    if type(value) in (tuple, list):
        return type(value)(_copied(v, memo) for v in value)
    if type(value) is dict:
        return {k: _copied(v, memo) for k, v in value.items()}
    return value  # other containers (a named tuple, a KV-cache object) are passed as they are


def rerun_forward(root: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                  rng: Optional[RngState], device: torch.device, *, copy_inputs: bool = False) -> Any:
    """``root.forward(*args, **kwargs)`` once more, as the first run saw it, leaving no trace
    on the first run's tensors (see the module doc).

    With ``copy_inputs`` the forward gets copies of the input tensors, for a step that goes on
    to its backward; without, the tensors themselves (the shape notes recognise the batch by
    identity, after a forward that raised: no backward follows).

    The root's own hooks do not run (``forward``, not ``__call__``); its submodules' hooks do,
    which is the point: the caller installs the watching hooks first. Exceptions propagate,
    after the RNG state and buffers are put back.
    """
    after = capture_rng(device)
    try:
        with _buffers_aside(root), torch.no_grad():
            if copy_inputs:
                memo: dict[int, torch.Tensor] = {}
                args, kwargs = _copied(args, memo), _copied(kwargs, memo)
            if rng is not None:
                _restore_rng(device, rng)
            return root.forward(*args, **kwargs)
    finally:
        _restore_rng(device, after)
