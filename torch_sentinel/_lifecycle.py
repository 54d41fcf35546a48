"""A sentinel's life outside the training loop: which model it is attached to, closing it when
the user never does (interpreter exit, garbage collection), and its state across a checkpoint.

Nothing here keeps a model or a sentinel alive: the registry is weak on both sides, and the
exit hook holds weak references to the sentinels' close methods.
"""

from __future__ import annotations

import atexit
import weakref
from collections.abc import Iterable, Sequence
from typing import Any, Callable, Optional

import torch
from torch import nn

from ._errors import SentinelError, format_message
from ._findings import Finding
from ._plain import decode, encode

__all__ = ["STATE_FORMAT", "attached_to", "dump_state", "forget", "load_state", "register"]

#: model root -> weak reference to its sentinel.
_ATTACHED: weakref.WeakKeyDictionary[nn.Module, weakref.ref[Any]] = weakref.WeakKeyDictionary()
#: id(sentinel) -> weak reference to the method that closes it without the user.
_CLOSERS: dict[int, weakref.WeakMethod[Callable[[], None]]] = {}
_exit_hook_installed = False

#: Version of the layout of Sentinel.state_dict(). Format 1 held the detectors' state as a
#: pickled blob: it is refused, never unpickled (unpickling runs whatever code the bytes name).
STATE_FORMAT = 2


def attached_to(root: nn.Module) -> Optional[Any]:
    """The sentinel attached to ``root``, if it is still alive."""
    ref = _ATTACHED.get(root)
    return ref() if ref is not None else None


def register(root: nn.Module, sentinel: Any, close: Callable[[], None]) -> None:
    """Record ``sentinel`` as attached to ``root``; ``close`` (a bound method of the sentinel)
    runs at interpreter exit unless :func:`forget` was called first."""
    global _exit_hook_installed
    _ATTACHED[root] = weakref.ref(sentinel)
    _CLOSERS[id(sentinel)] = weakref.WeakMethod(close)
    if not _exit_hook_installed:
        # Registered at the first attach(), not at import: atexit runs handlers last-in
        # first-out, so ours runs before anything registered earlier (logging's shutdown).
        atexit.register(_close_all_at_exit)
        _exit_hook_installed = True


def forget(root: nn.Module, sentinel: Any) -> None:
    if attached_to(root) is sentinel:
        del _ATTACHED[root]
    _CLOSERS.pop(id(sentinel), None)


def _close_all_at_exit() -> None:
    """The README's loop never calls detach(): at interpreter exit, the last window still goes
    through the detectors and the sinks, and the manifest gets its result."""
    for ref in list(_CLOSERS.values()):
        close = ref()
        if close is not None:
            close()


def dump_state(step: int, nonfinite_reported: bool, findings: Iterable[Finding],
               detectors: Sequence[Any]) -> dict[str, Any]:
    """Plain data only (tensors, numbers, strings, lists, dicts, None, bools), so a checkpoint
    holding it loads with ``torch.load(..., weights_only=True)``; see ``_plain.py``."""
    return {
        "format": STATE_FORMAT,
        "step": step,
        "nonfinite_reported": nonfinite_reported,
        "findings": [encode(f.to_dict(), f"finding {f.kind!r}") for f in findings],
        "detectors": {d.kind: d.state_dict() for d in detectors},
    }


def load_state(state: Any, detectors: Sequence[Any],
               device: Optional[torch.device] = None) -> tuple[int, bool, list[Finding]]:
    """Restore the detectors from ``state`` (saved tensors go to ``device``); return
    (step, nonfinite_reported, findings)."""
    if isinstance(state, dict) and state.get("format") == 1 and isinstance(state.get("detectors"), bytes):
        raise SentinelError(format_message(
            "Sentinel.load_state_dict() got a sentinel state saved by an older torch_sentinel (format 1)",
            expected=f"the plain-data state of format {STATE_FORMAT}",
            arrived="format 1, whose detector windows are a pickled blob: loading it could run any code "
                    "the blob names, so it is not read",
            next_check="resume once without load_state_dict() (pass attach(..., start_step=checkpoint step) "
                       "to keep the step numbers) and save sentinel.state_dict() again with this version",
        ))
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        arrived = f"a dict with keys {sorted(map(str, state))[:6]}" if isinstance(state, dict) else type(state).__name__
        raise SentinelError(format_message(
            "Sentinel.load_state_dict() got something that is not a sentinel state",
            expected=f"the dict Sentinel.state_dict() returned (format {STATE_FORMAT})",
            arrived=arrived,
            next_check="pass checkpoint['sentinel'], not the model's or the optimizer's state",
        ))
    saved = state["detectors"]
    for d in detectors:
        if d.kind in saved:
            d.load_state_dict(saved[d.kind], device)
    findings = [Finding.from_dict(decode(data, "a finding")) for data in state["findings"]]
    return int(state["step"]), bool(state["nonfinite_reported"]), findings
