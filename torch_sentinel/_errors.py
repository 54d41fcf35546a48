"""The one exception hierarchy: everything the sentinel raises derives from SentinelError.

Messages follow one layout so that a user can read them top to bottom:
what was expected, what arrived, where (module, step, shape), and what to check next.
"""

from __future__ import annotations

import os
import types
from typing import Any, Callable, Optional, TypeVar

__all__ = [
    "InstrumentationError",
    "NonFiniteError",
    "OptionError",
    "ReplicaDivergenceError",
    "SentinelError",
    "ShapeContractError",
    "format_message",
    "raised_at_entry",
    "without_our_frames",
]

_E = TypeVar("_E", bound=BaseException)
#: This package's directory: frames from files under it are the sentinel's own.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def format_message(
    headline: str,
    *,
    expected: Optional[str] = None,
    arrived: Optional[str] = None,
    where: Optional[str] = None,
    next_check: Optional[str] = None,
) -> str:
    """Lay out an error message in the house order. Empty parts are left out."""
    lines = [headline]
    for label, text in (
        ("expected", expected),
        ("arrived", arrived),
        ("where", where),
        ("next", next_check),
    ):
        if text:
            lines.append(f"  {label + ':':9s} {text}")
    return "\n".join(lines)


class SentinelError(RuntimeError):
    """Base class of every error torch_sentinel raises."""


class OptionError(SentinelError, ValueError, TypeError):
    """An ``attach()`` option is unknown, of the wrong type or out of range. Raised by
    ``attach()`` before anything is installed. It is also a ``ValueError`` and a ``TypeError``,
    so code that catches either for a bad argument keeps working."""


class InstrumentationError(SentinelError):
    """The sentinel cannot observe what it was asked to observe (for example, hooks that
    torch.compile skipped). Raised rather than watching with blind eyes."""


class ShapeContractError(SentinelError):
    """A named-axis shape contract was violated."""


class NonFiniteError(SentinelError):
    """The first step at which a NaN or Inf appeared, with the boundary and module where it started.

    Attributes:
        step: optimizer steps completed before the faulty one (0-based).
        boundary: one of ``torch_sentinel.BOUNDARIES``.
        module: qualified module name relative to the attached model, or None.
        kind: always ``"non_finite"``.
        nan, posinf, neginf: element counts in the first offending tensor, or None when the
            tensor was not retained (deferred mode records only which kinds were present).
        shape, dtype: of the first offending tensor, when known.
        rank: the distributed rank where the fault started, or None outside torch.distributed.
        evidence: every number behind the message.
    """

    kind = "non_finite"

    def __init__(
        self,
        message: str,
        *,
        step: int,
        boundary: str,
        module: Optional[str],
        nan: Optional[int] = None,
        posinf: Optional[int] = None,
        neginf: Optional[int] = None,
        shape: Optional[tuple[int, ...]] = None,
        dtype: Optional[str] = None,
        rank: Optional[int] = None,
        evidence: Optional[dict[str, Any]] = None,
    ) -> None:
        super().__init__(message)
        self.step = step
        self.boundary = boundary
        self.module = module
        self.nan = nan
        self.posinf = posinf
        self.neginf = neginf
        self.shape = shape
        self.dtype = dtype
        self.rank = rank
        self.evidence = dict(evidence or {})


class ReplicaDivergenceError(SentinelError):
    """Data-parallel replicas that should hold bit-identical tensors do not (raised on every rank
    at the same step; see ``torch_sentinel/_replicas``).

    Attributes:
        step: the step at whose start the check found the replicas differing.
        rank: the first diverged rank; ranks: every diverged rank.
        module: the module owning the parameter (relative to the attached model), or None.
        parameter: the parameter's qualified name; state: the optimizer state key
            (``"exp_avg"``...) when the differing tensor is optimizer state, else None.
        chunk: ``(start, end)`` in the flattened (local) tensor, holding a differing element.
        kind: always ``"replica_divergence"``.
        evidence: every number behind the message.
    """

    kind = "replica_divergence"

    def __init__(self, message: str, *, step: int, rank: int, ranks: tuple[int, ...],
                 module: Optional[str], parameter: str, state: Optional[str] = None,
                 chunk: Optional[tuple[int, int]] = None,
                 evidence: Optional[dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.step = step
        self.rank = rank
        self.ranks = ranks
        self.module = module
        self.parameter = parameter
        self.state = state
        self.chunk = chunk
        self.evidence = dict(evidence or {})

def without_our_frames(err: _E) -> _E:
    """``err`` with the sentinel's own frames taken off its traceback.

    An error the user asked for (a ``NonFiniteError`` under ``on_nonfinite="raise"``) is made
    deep inside the sentinel: a row drained, a batch of outputs reduced, a fault located. Those
    frames say nothing about the user's program. An entry point (a hook, a patch, a public
    method) re-raises the error with this, so the traceback shows the user's line, torch's
    frames, and the one frame of ours that re-raised it. Frames of other code between ours stay
    (the model's forward, run again to localise a fault), and so do ``__cause__`` and
    ``__context__``.
    """
    frames: list[types.TracebackType] = []
    tb = err.__traceback__
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    kept: Optional[types.TracebackType] = None
    for tb in reversed(frames):
        if not tb.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            kept = types.TracebackType(kept, tb.tb_frame, tb.tb_lasti, tb.tb_lineno)
    return err.with_traceback(kept)


def raised_at_entry(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn``; a ``SentinelError`` leaves from here, without the frames below (see
    :func:`without_our_frames`). For the hooks where the user's call enters the sentinel."""
    try:
        return fn(*args, **kwargs)
    except SentinelError as err:
        raise without_our_frames(err)  # noqa: B904 - the same error, its traceback shortened
