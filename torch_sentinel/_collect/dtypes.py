"""Every dtype at its own width: which tensors a probe reduces, and in which row dtype.

A value is non-finite only if it is NaN or Inf in its own dtype. float32 slots hold every
fp16/bf16/float32 value exactly, but a finite float64 value beyond ~3.4e38 would read as Inf
there, so the first float64 tensor widens the row to float64 (once; the fast ``aminmax(out=)``
path then serves float64 models). A dtype torch has no reduction for on the device (float8
variants on most devices) is skipped by the probe that met it, with one warning saying what
is not watched, never an exception in a hook.
"""

from __future__ import annotations

import warnings

import torch

from .ledger import Ledger
from .tensors import NATIVE_DTYPES, reduces

__all__ = ["DtypePolicy"]


class DtypePolicy:
    """Decides, on the host and without a device read, whether a probe reduces a tensor."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        #: (probe, dtype) pairs already warned about.
        self._skipped: set[tuple[str, torch.dtype]] = set()

    def admit(self, t: torch.Tensor, compiling: bool, probe: str) -> bool:
        """Whether ``t`` can be reduced into the row; widens the row for float64 first."""
        dtype = t.dtype
        if compiling:
            return dtype in NATIVE_DTYPES  # decided on the eager path, never while tracing
        if dtype is self.ledger.dtype:
            return True
        if not reduces(dtype, t.device):
            self._warn(probe, dtype, t.device)
            return False
        self.ledger.fit(dtype)
        return True

    def _warn(self, probe: str, dtype: torch.dtype, device: torch.device) -> None:
        if (probe, dtype) in self._skipped:
            return
        self._skipped.add((probe, dtype))
        name = str(dtype).replace("torch.", "")
        warnings.warn(
            f"torch_sentinel: {name} tensors are not watched by the {probe or 'sentinel'!r} probe: torch has no "
            f"min/max reduction for {name} on {device.type}; tensors of other dtypes still are",
            RuntimeWarning,
            stacklevel=5,
        )
