"""Per-unit masks that outlive a compiled step: reduced inside the graph, kept outside it.

Some evidence is a boolean per unit OR-ed over a window of steps (a ReLU unit that fired once,
an input feature that varied once). Its size is known only from the first tensor seen, and
under ``torch.compile`` that first sight is a trace: a mask allocated there would be a graph
intermediate, born again at every call, and host bookkeeping (a dict of sites, a step counter)
read there would become guards that recompile. So the work is split:

- inside the compiled graph, the hook reduces the activation to one boolean per unit (traced,
  so inductor fuses it with the op that produced the activation);
- that small vector goes to one opaque custom op, ``torch_sentinel::fold_mask``, which the graph
  calls at run time like any extern kernel: eager Python there allocates the mask on first
  sight, ORs the vector into it with one device op, and applies the sampling schedule, all
  without a host read and without anything dynamo could guard on (the op's only constants are
  two ints fixed at trace time).

The op declares that it mutates a one-element token tensor so that the compiler keeps it (an op
returning nothing and mutating nothing would be dead code). Needs ``torch.library.custom_op``
(torch >= 2.4); :func:`available` says whether it is there.
"""

from __future__ import annotations

import itertools
import logging
import weakref
from typing import Any, Callable, Optional

import torch

__all__ = ["MaskTap", "available"]

logger = logging.getLogger("torch_sentinel")

#: Live taps by id; the op finds its receiver here at run time (weak: a dropped sentinel's
#: compiled code calling the op is a no-op, never a crash).
_TAPS: weakref.WeakValueDictionary[int, MaskTap] = weakref.WeakValueDictionary()
_IDS = itertools.count(1)
_OP: Optional[Callable[..., None]] = None
_TRIED = False


def _register() -> Optional[Callable[..., None]]:
    global _OP, _TRIED
    if _OP is not None or _TRIED:
        return _OP
    _TRIED = True
    custom_op = getattr(getattr(torch, "library", None), "custom_op", None)
    if custom_op is None:  # pragma: no cover - torch < 2.4
        return None

    # The schema is spelled out: this module's annotations are strings, which torch 2.4's
    # schema inference does not read.
    def fold_mask(token: torch.Tensor, bits: torch.Tensor, tap: int, key: int) -> None:
        receiver = _TAPS.get(tap)
        if receiver is not None:
            receiver.receive(key, bits)

    def fake(token: torch.Tensor, bits: torch.Tensor, tap: int, key: int) -> None:
        return None

    try:
        op = custom_op("torch_sentinel::fold_mask", mutates_args=("token",),
                       schema="(Tensor(a!) token, Tensor bits, int tap, int key) -> ()")(fold_mask)
        op.register_fake(fake)
    except Exception as exc:  # pragma: no cover - an older custom_op API
        logger.debug("torch_sentinel: torch.library.custom_op unusable here: %s", exc)
        return None
    _OP = op
    return _OP


def available() -> bool:
    """Whether masks can be kept under torch.compile with this torch (``custom_op``, >= 2.4)."""
    return _register() is not None


class MaskTap:
    """One receiver of per-unit boolean vectors from compiled code.

    Args:
        receive: called at run time, eagerly, with ``(key, bits)``: ``key`` is the int the
            traced hook passed, ``bits`` a bool vector on the device, valid only during the call
            (copy or fold it; never keep it).
        device: where the token lives (the model's device, so the op never moves data).
    """

    def __init__(self, receive: Callable[[int, torch.Tensor], None], device: torch.device) -> None:
        self._receive: Optional[Callable[[int, torch.Tensor], None]] = receive
        self.id = next(_IDS)
        self.token = torch.zeros(1, device=device)
        self.op = _register()
        _TAPS[self.id] = self

    def emit(self, key: int, bits: torch.Tensor) -> None:
        """Call from a hook being traced: puts the op into the graph (no host work at run time
        beyond the receiver's)."""
        if self.op is not None:
            self.op(self.token, bits, self.id, key)

    def receive(self, key: int, bits: Any) -> None:
        receive = self._receive
        if receive is None:
            return
        try:
            with torch.no_grad():
                receive(key, bits)
        except Exception as exc:  # runs inside the user's compiled step: never the reason it fails
            self._receive = None
            logger.warning("torch_sentinel: a per-unit mask under torch.compile failed and is switched "
                           "off (%s: %s); training goes on", type(exc).__name__, exc)

    def close(self) -> None:
        self._receive = None
        _TAPS.pop(self.id, None)
