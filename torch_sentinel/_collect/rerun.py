"""Run the step's forward again, on the cold path, to localise what the hot path only detected.

On ordinary steps the collector watches the model's outputs, not every module (see
``watching.py``). When those show something wrong (a non-finite output, an exception), the
forward is run a second time with every module watched: same inputs (references the root's
pre-hook kept for the duration of the forward), same RNG state (captured at the root's entry),
same weights (the optimizer has not stepped yet), under ``no_grad`` (the user's graph of the
first run is still alive; a second graph would double the activation memory).

What the second run could change is put back: the RNG state continues from where the first run
left it, and every buffer (BatchNorm's running statistics, counters) gets its value from before
the rerun. Python attributes a forward changes on itself (a call counter, a KV cache) are not
restored; the rerun is the cold path of a step that already failed.
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
def _buffers_kept(root: nn.Module) -> Iterator[None]:
    saved = [(b, b.detach().clone()) for b in root.buffers() if b.device.type != "meta"]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, value in saved:
                if b.shape == value.shape:
                    b.copy_(value)


def rerun_forward(root: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                  rng: Optional[RngState], device: torch.device) -> Any:
    """``root.forward(*args, **kwargs)`` once more, as the first run saw it, leaving no trace.

    The root's own hooks do not run (``forward``, not ``__call__``); its submodules' hooks do,
    which is the point: the caller installs the watching hooks first. Exceptions propagate,
    after the RNG state and buffers are put back.
    """
    after = capture_rng(device)
    try:
        with _buffers_kept(root), torch.no_grad():
            if rng is not None:
                _restore_rng(device, rng)
            return root.forward(*args, **kwargs)
    finally:
        _restore_rng(device, after)
