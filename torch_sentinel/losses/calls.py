"""One observed loss call, as host facts: what was passed, in which shapes, made by which op, where.

:func:`describe` reads a call's arguments against its contract without touching a device value:
shapes, dtypes, the keywords that change the contract (``reduction``, ``ignore_index``,
``log_target``, ``log_input``, ``blank``, ...), the class dim the loss reads, what produced the
input (its autograd node: a ``log_softmax`` over dim 2, a Linear's output, an ``exp``), and
whether input and target broadcast. :class:`LossCall` is the frozen record of it that the
detectors read (through the probe, never through ``meta.extra``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import sys
from typing import Any, Callable, Optional

import torch

from .contracts import Contract

__all__ = ["Described", "LossCall", "call_site", "describe"]

#: The keywords that change what a loss expects.
OPTIONS = ("reduction", "ignore_index", "label_smoothing", "log_target", "log_input", "blank")
#: Autograd nodes that normalise over a dim (their ``_saved_dim``).
_NORMALISERS = {"LogSoftmaxBackward0": "log_softmax", "SoftmaxBackward0": "softmax"}
#: Nodes of a Linear (or matmul) output; for a 3-D input they sit behind one view.
_LINEAR = ("AddmmBackward0", "MmBackward0", "LinearBackward0")
_VIEWS = ("ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0")
#: Nodes that move or copy values without changing them.
_SHAPE_OPS = (*_VIEWS, "SqueezeBackward0", "SqueezeBackward1", "UnsqueezeBackward0", "ExpandBackward0",
              "CloneBackward0", "SliceBackward0", "SelectBackward0", "PermuteBackward0", "TransposeBackward0",
              "TBackward0", "AsStridedBackward0", "ToCopyBackward0")
#: Ops whose output is never negative: a rate, not a log-rate.
NONNEGATIVE_OPS = ("exp", "softplus", "relu", "sigmoid", "abs", "square", "pow")


@dataclasses.dataclass(frozen=True)
class LossCall:
    """Host facts of one call of a loss on a probed step (no device value in here).

    ``block`` names the ledger block holding the call's figures (``""`` when the contract
    measures none); the figures themselves reach the detector with the step's record.
    """

    step: int
    loss: str
    site: str
    block: str
    input_shape: tuple[int, ...]
    target_shape: Optional[tuple[int, ...]]
    input_dtype: str
    #: "indices" (integer targets), "values" (floating), or "none".
    target_kind: str
    #: The dim the loss reads as classes (>= 0), or None for an element-wise loss.
    class_dim: Optional[int]
    #: The dim the target's rows were checked over (class-probability or KL targets), if any.
    target_dim: Optional[int]
    #: Whether ``class_dim``/``target_dim`` is known rather than guessed (KL's last dim).
    dim_known: bool
    #: The op that computed the input's values ("log_softmax", "linear", "exp", "sigmoid", ...),
    #: looked up through view-like nodes; None without a node.
    producer: Optional[str]
    #: The dim a softmax/log_softmax right before the loss normalised over (>= 0).
    producer_dim: Optional[int]
    #: The input is a Linear's output as returned (its features, the outputs, on the last dim).
    producer_linear: bool
    options: tuple[tuple[str, Any], ...]
    #: The shape input and target broadcast to, when it is not the input's own.
    broadcast_shape: Optional[tuple[int, ...]]
    #: The module whose output the input is (a Softmax module, or the model itself), if known.
    module: Optional[str]
    #: The figures this call measured.
    measured: tuple[str, ...]

    def option(self, name: str, default: Any = None) -> Any:
        return dict(self.options).get(name, default)


@dataclasses.dataclass
class Described:
    """What :func:`describe` found: the facts (less step, site, block, module, measured), the
    tensors the device checks read, and their class dims."""

    facts: dict[str, Any]
    #: Every tensor argument the contract names (input first): what must reach the model.
    inputs: list[Any]
    tensors: dict[str, torch.Tensor]
    dims: tuple[Optional[int], Optional[int]]
    extra: dict[str, Any]


_SIGNATURES: dict[int, inspect.Signature] = {}


def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    sig = _SIGNATURES.get(id(fn))
    if sig is None:
        sig = _SIGNATURES[id(fn)] = inspect.signature(fn)
    return sig


def _signed(dim: int) -> int:
    """``_saved_dim`` of a node is an unsigned 64-bit int: -1 reads as 2**64 - 1."""
    return dim - (1 << 64) if dim >= (1 << 63) else dim


def _producer(x: torch.Tensor) -> tuple[Optional[str], Optional[int], bool]:
    """What made ``x``: the op that computed its values (looked up through up to four view-like
    nodes: a ``.view``/``.squeeze`` of a sigmoid output is still a sigmoid output), the dim a
    softmax/log_softmax right before it normalised over (None behind a view, where dims move),
    and whether ``x`` is a Linear's output as the Linear returned it (features last)."""
    node = x.grad_fn
    if node is None:
        return None, None, False
    name = type(node).__name__
    if name in _NORMALISERS:
        saved: Any = node  # the node's class (generated per op) declares _saved_dim; torch's stub does not
        return _NORMALISERS[name], _signed(int(saved._saved_dim)) % max(1, x.ndim), False
    if name in _LINEAR:
        return "linear", None, True
    first = node.next_functions[0][0] if node.next_functions else None
    if name in _VIEWS and first is not None and type(first).__name__ in _LINEAR:
        return "linear", None, True  # a Linear over a 3-D input: addmm, then a view back
    for _ in range(4):
        if name not in _SHAPE_OPS or not node.next_functions or node.next_functions[0][0] is None:
            break
        node = node.next_functions[0][0]
        name = type(node).__name__
    if name in _NORMALISERS:
        return _NORMALISERS[name], None, False
    if name in _LINEAR:
        return "linear", None, False
    return name.removesuffix("Backward0").removesuffix("Backward1").lower(), None, False


def describe(contract: Contract, fn: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Optional[Described]:
    """The host facts of a call of ``fn`` (the original ``F.<name>``), or None when it is not a
    training call of the loss (no tensor input that requires grad) or its arguments do not bind."""
    try:
        bound = _signature(fn).bind(*args, **kwargs)
    except TypeError:
        return None  # torch will say so itself
    given = bound.arguments
    params = _signature(fn).parameters
    names = contract.inputs
    x = given.get(names[0])
    if not isinstance(x, torch.Tensor):
        return None
    grads = [given.get(n) for n in names]
    if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in grads):
        return None
    # the target: the last of the first three named tensors that is not an input of the model
    target_name = "target" if "target" in names else ("targets" if "targets" in names else None)
    t = given.get(target_name) if target_name else None
    t = t if isinstance(t, torch.Tensor) else None
    options = tuple((k, given.get(k, params[k].default)) for k in OPTIONS if k in params)
    producer, producer_dim, linear = _producer(x)
    class_dim: Optional[int] = None
    dim_known = True
    if contract.class_dim == 1:
        class_dim = 1 if x.ndim >= 2 else 0
    elif contract.class_dim == -1:
        class_dim = max(0, x.ndim - 1)
    target_dim: Optional[int] = None
    if contract.name == "kl_div":  # element-wise: the distribution dim is the producer's, else the last
        dim_known = producer_dim is not None or x.ndim <= 2
        target_dim = producer_dim if producer_dim is not None else max(0, x.ndim - 1)
    elif contract.name == "cross_entropy" and t is not None and t.is_floating_point():
        target_dim = class_dim
    broadcast = None
    if "loss_broadcast" in contract.clauses and t is not None and tuple(t.shape) != tuple(x.shape):
        try:
            out = tuple(torch.broadcast_shapes(x.shape, t.shape))
        except RuntimeError:
            out = tuple(x.shape)  # torch raises on this mismatch itself
        broadcast = out if out != tuple(x.shape) else None
    facts = {
        "loss": contract.name, "input_shape": tuple(x.shape),
        "target_shape": tuple(t.shape) if t is not None else None,
        "input_dtype": str(x.dtype).replace("torch.", ""),
        "target_kind": "none" if t is None else ("values" if t.is_floating_point() else "indices"),
        "class_dim": class_dim, "target_dim": target_dim, "dim_known": dim_known, "producer": producer,
        "producer_dim": producer_dim, "producer_linear": linear, "options": options,
        "broadcast_shape": broadcast,
    }
    tensors = {"input": x}
    if t is not None and not (contract.name == "cross_entropy" and not t.is_floating_point()):
        tensors["target"] = t  # index targets of cross-entropy: torch checks their range
    extra = {"target_lengths": given.get("target_lengths"), "blank": dict(options).get("blank", 0),
             "log_target": dict(options).get("log_target", False)}
    return Described(facts, [given.get(n) for n in names], tensors, (class_dim, target_dim), extra)


#: Frames inside these directories are not a call site: torch's own code and this package.
_SKIP = (os.path.dirname(torch.__file__ or "") + os.sep,
         os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep)


def _library(filename: str) -> bool:
    return "site-packages" in filename or "dist-packages" in filename


def call_site(depth: int = 1) -> str:
    """``file:line`` of the first frame outside torch and this package; when that frame is
    in an installed library (transformers, lightning), the user's frame that called it too."""
    frame = sys._getframe(depth)
    site = ""
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_SKIP):
            here = f"{_short(name)}:{frame.f_lineno}"
            if not site:
                site = here
                if not _library(name):
                    return site
            elif not _library(name):
                return f"{site} (called from {here})"
        frame = frame.f_back  # type: ignore[assignment]
    return site or "<unknown>"


@functools.lru_cache(maxsize=256)
def _short(path: str) -> str:
    """``path`` relative to the working directory when it lies under it (cached: two getcwd calls)."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel
