"""What the probes cannot read, said once: never the reason training stops.

A module output that is nested, sparse or complex, and a forward or backward running inside a
``torch.func`` transform, are skipped by the collector. Each kind gets ONE warning that names
what is not watched (and the first module where it was met); integer and bool outputs are
skipped silently, since they cannot hold NaN or Inf.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from .tensors import unwatched_kind

__all__ = ["Unwatched", "functorch_active"]

_active = getattr(torch._C, "_are_functorch_transforms_active", None)


def functorch_active() -> bool:
    """True inside ``torch.func.grad`` / ``vmap`` / ``jvp`` (any functorch transform)."""
    return bool(_active()) if _active is not None else False


class Unwatched:
    """Remembers which kinds were already reported, so that each is warned about once."""

    def __init__(self) -> None:
        self._said: set[str] = set()

    def output(self, t: torch.Tensor, name: str, module: Any) -> None:
        kind = unwatched_kind(t)
        if kind and kind not in self._said:
            self._said.add(kind)
            where = f"'{name}' ({type(module).__name__})" if name else f"the model ({type(module).__name__})"
            self._warn(
                f"outputs that are {kind} are not watched for NaN/Inf (first met at {where}, "
                f"dtype {str(t.dtype).replace('torch.', '')}); the other outputs, gradients and weights still are"
            )

    def transform(self) -> None:
        if "transform" not in self._said:
            self._said.add("transform")
            self._warn(
                "forward and backward passes inside torch.func transforms (grad, vmap, jacrev, ...) are not "
                "watched; ordinary forward/backward passes and optimizer steps still are"
            )

    def batch_failed(self, exc: BaseException) -> None:
        if "batch" not in self._said:
            self._said.add("batch")
            self._warn(
                f"a batched reduction of module outputs failed ({type(exc).__name__}: {exc}); those outputs "
                "were not checked at this boundary; the next boundaries, losses, gradient norms and weights still are"
            )

    def rerun_failed(self, exc: BaseException) -> None:
        if "rerun" not in self._said:
            self._said.add("rerun")
            self._warn(
                f"running a faulty step's forward again to localise the fault failed ({type(exc).__name__}: "
                f"{exc}); such faults are reported at the model's output, with the step and boundary, but not "
                "the module that made them; pass check='deferred' to watch every module on every step"
            )

    @staticmethod
    def _warn(message: str) -> None:
        warnings.warn("torch_sentinel: " + message, RuntimeWarning, stacklevel=2)
