"""Notes on shape errors raised inside an attached model.

PyTorch says ``mat1 and mat2 shapes cannot be multiplied (8x32 and 16x4)``; it does not say
which layer, what that layer's contract is, or who produced the tensor. :class:`ShapeNotes`
hangs a forward hook with ``always_call=True`` on every module: it still runs when its module's
forward raises, with the exception in ``sys.exc_info()``, and at the innermost module it adds a
note (the error keeps its type) naming the module path, its contract in words, the shapes that
arrived and the module that produced them. On a successful forward the hook remembers which
module produced each output tensor (``id`` and ``.shape``: metadata, no tensor op).

An attached model does not carry those hooks on its steps (a Python call per module per step):
``watch.py`` hooks only the model's entry and, when an error leaves it, runs the forward again
with these hooks installed (cold path). The dry run (``dry_run.py``) installs them directly.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from typing import Any, Callable, Optional

import torch
from torch import nn

from .._collect.compat import is_compiling as _is_compiling
from .._collect.hookset import HookSet, ModuleHook
from .._collect.tensors import iter_tensors
from .._errors import SentinelError, ShapeContractError
from .._findings import Finding
from .contracts import explain_broadcast

__all__ = ["Annotation", "ShapeNotes", "layer_contract", "mark_seen", "seen", "worth_a_note"]


_SEEN = "__torch_sentinel_shape_seen__"
_SHAPE_WORDS = re.compile(
    r"shape|size|dimension|\bdim\b|mat1|mat2|broadcast|channels|features|normalized_shape|"
    r"index out of range|out of bounds",
    re.IGNORECASE,
)
_MATMUL = re.compile(r"\((\d+)x(\d+) and (\d+)x(\d+)\)")
_BROADCAST = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) at non-singleton dimension (\d+)")
_NEXT = ("name the axes (e.g. B F) and fix the data/layer contract; do not tune the learning "
         "rate or reshape by trial and error: the computation cannot represent the intended "
         "operation yet")


def _shape(t: Any) -> str:
    shape = tuple(int(s) for s in t.shape)
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _first_tensor(args: tuple[Any, ...]) -> Optional[torch.Tensor]:
    for t in iter_tensors(args):
        return t
    return None


def _conv_contract(name: str, m: nn.Module, x: torch.Tensor) -> tuple[str, Optional[str]]:
    k = len(m.kernel_size)  # type: ignore[arg-type]
    spatial = ", ".join("HWD"[i] if k > 1 else "L" for i in range(k))
    c = int(m.in_channels)  # type: ignore[arg-type]
    text = (f"{type(m).__name__}(in_channels={c}, out_channels={m.out_channels}): "
            f"(N, {c}, {spatial}) -> (N, {m.out_channels}, ...)")
    if x.dim() not in (k + 1, k + 2):
        return text, (f"Rank mismatch: input has rank {x.dim()}, but {name} expects rank "
                      f"{k + 2} (N, C, {spatial}) or {k + 1} without the batch axis")
    got = int(x.shape[x.dim() - k - 1])
    if got != c:
        return text, f"Channel mismatch: input has {got} channels, but {name} expects {c}"
    return text, None


def layer_contract(name: str, module: nn.Module, args: tuple[Any, ...]) -> tuple[Optional[str], Optional[str]]:
    """(the layer's contract in words, the violation found in ``args``) for the layers whose
    contract is known; (None, None) for others. Reads shapes only, except for an Embedding's
    index range, which is read on this cold path."""
    x = _first_tensor(args)
    if x is None:
        return None, None
    shown = name or "<model>"
    if isinstance(module, nn.Linear):
        f_in, f_out = module.in_features, module.out_features
        text = f"Linear(in_features={f_in}, out_features={f_out}): (*, {f_in}) -> (*, {f_out})"
        if x.dim() == 0:
            return text, f"Rank mismatch: input is a scalar, but {shown} expects (*, {f_in})"
        got = int(x.shape[-1])
        if got != f_in:
            return text, f"Feature mismatch: input has {got} features, but {shown} expects {f_in}"
        return text, None
    if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)):
        return _conv_contract(shown, module, x)
    if isinstance(module, nn.LayerNorm):
        want: tuple[int, ...] = tuple(module.normalized_shape)
        text = f"LayerNorm(normalized_shape={list(want)}): (*, {', '.join(map(str, want))}) -> same"
        trailing = tuple(int(s) for s in x.shape[-len(want):]) if x.dim() >= len(want) else tuple(x.shape)
        if trailing != want:
            return text, (f"Normalized-shape mismatch: input's trailing dimensions are {trailing}, but "
                          f"{shown} normalizes over {want}")
        return text, None
    if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.GroupNorm, nn.InstanceNorm1d,
                           nn.InstanceNorm2d, nn.InstanceNorm3d)):
        c = int(getattr(module, "num_features", None) or module.num_channels)  # type: ignore[arg-type]
        text = f"{type(module).__name__}({c}): (N, {c}, ...) -> same"
        channels = int(x.shape[1]) if x.dim() >= 2 else None
        if channels != c:
            return text, f"Feature mismatch: input has {channels} channels at dim 1, but {shown} expects {c}"
        return text, None
    if isinstance(module, nn.Embedding):
        n = module.num_embeddings
        text = f"Embedding(num_embeddings={n}, embedding_dim={module.embedding_dim}): indices in [0, {n - 1}] -> (*, {module.embedding_dim})"
        if x.is_floating_point() or x.is_complex():
            return text, f"Index dtype mismatch: input is {str(x.dtype).replace('torch.', '')}, but {shown} expects integer indices (long/int)"
        if x.numel() and x.device.type not in ("meta", "cuda"):  # a CUDA index fault poisons the context
            lo, hi = int(x.min()), int(x.max())
            if lo < 0 or hi >= n:
                return text, f"Index out of range: indices span [{lo}, {hi}], but {shown} has num_embeddings={n} (valid 0..{n - 1})"
        return text, None
    if isinstance(module, (nn.RNNBase,)):
        size = module.input_size
        text = f"{type(module).__name__}(input_size={size}): (*, L, {size}) -> (*, L, {module.hidden_size})"
        last = int(x.shape[-1]) if x.dim() else None
        if last != size:
            return text, f"Feature mismatch: input has {last} features, but {shown} expects {size}"
        return text, None
    if isinstance(module, nn.MultiheadAttention):
        e = module.embed_dim
        text = f"MultiheadAttention(embed_dim={e}): query (*, L, {e})"
        last = int(x.shape[-1]) if x.dim() else None
        if last != e:
            return text, f"Feature mismatch: query has {last} features, but {shown} expects embed_dim={e}"
        return text, None
    return None, None


def _explain_message(message: str) -> Optional[str]:
    """The seeds' reading of PyTorch's own wording, when it carries the sizes."""
    m = _MATMUL.search(message)
    if m:
        r1, c1, r2, c2 = m.groups()
        return (f"matrix multiplication contracts the inner dimension: ({r1}, {c1}) @ ({r2}, {c2}) "
                f"needs {c1} == {r2}; the inner dimensions are {c1} and {r2}")
    m = _BROADCAST.search(message)
    if m:
        a, b, dim = m.groups()
        return (f"broadcasting compares shapes right to left; at dimension {dim} they compare as "
                f"{a} and {b}, which are neither equal nor 1")
    return None


def seen(exc: BaseException) -> bool:
    """Whether a ShapeNotes hook already handled ``exc`` (noted it, or decided it needs none)."""
    return bool(getattr(exc, _SEEN, False))


def mark_seen(exc: BaseException) -> bool:
    """Mark ``exc`` handled; False for an exception type that takes no attributes (``__slots__``)."""
    try:
        setattr(exc, _SEEN, True)
    except Exception:
        return False
    return True


def worth_a_note(name: str, module: nn.Module, args: tuple[Any, ...], exc: BaseException) -> bool:
    """Whether an error raised in ``module``'s forward on ``args`` gets a note or a finding:
    the test :meth:`ShapeNotes.describe` applies, without building anything."""
    if isinstance(exc, ShapeContractError):
        return True
    if isinstance(exc, SentinelError):
        return False
    return layer_contract(name, module, args)[1] is not None or bool(_SHAPE_WORDS.search(str(exc)))


@dataclasses.dataclass
class Annotation:
    """What a shape error gets: a note (None for a contract error, whose message says it all)
    and the ``shape_mismatch`` finding's module, message and evidence."""

    note: Optional[str]
    module: str
    message: str
    evidence: dict[str, Any]


class ShapeNotes:
    """The per-module note hooks over ``modules`` (name, module), a list read when the hooks
    are installed (a module replaced after attach is hooked in its place).

    ``hooks``: install the hooks there at once (the dry run); otherwise :meth:`watch` installs
    them on demand. ``on_finding`` receives the ``shape_mismatch`` Finding; ``step`` tells
    which step it is.
    """

    def __init__(
        self,
        modules: list[tuple[str, nn.Module]],
        hooks: Optional[HookSet] = None,
        *,
        on_finding: Optional[Callable[[Finding], None]] = None,
        step: Callable[[], Optional[int]] = lambda: None,
        rank: Optional[int] = None,
    ) -> None:
        self.modules = modules
        self.names = [n for n, _ in modules]
        self.types = [type(m).__name__ for _, m in modules]
        self.on_finding = on_finding
        self.step = step
        self.rank = rank
        #: id(tensor) -> (module slot, shape) of the latest module outputs; a tensor's id is only
        #: trusted together with its shape, since ids are reused after a tensor is freed.
        self._produced: dict[int, tuple[int, torch.Size]] = {}
        self._limit = 4 * len(modules) + 64
        #: False when the producers were not traced (the note then says so).
        self.traced = True
        #: Where annotations go instead of onto the exception (a rerun's): see :meth:`capture`.
        self._captured: Optional[list[Annotation]] = None
        if hooks is not None:
            self.watch(hooks)

    def watch(self, hooks: HookSet, skip: Optional[nn.Module] = None) -> None:
        """Install the always-called forward hook on every module but ``skip`` (removed with
        ``hooks``)."""
        self.names = [n for n, _ in self.modules]
        self.types = [type(m).__name__ for _, m in self.modules]
        for slot, (_, module) in enumerate(self.modules):
            if module is not skip:
                hooks.add(module.register_forward_hook(ModuleHook(self._on_output, slot), always_call=True))

    def capture(self, into: Optional[list[Annotation]]) -> None:
        """Collect annotations in ``into`` rather than applying them (None: apply again)."""
        self._captured = into

    def seed(self, args: Any, kwargs: Any, *, batch: bool = True,
             produced: Optional[dict[int, tuple[int, torch.Size]]] = None) -> None:
        """Forget earlier tensors; remember ``produced`` (id -> (slot, shape)) and, with
        ``batch``, the call's tensors as the model's input."""
        self._produced.clear()
        if produced:
            self._produced.update(produced)
        if batch:
            for t in iter_tensors((args, kwargs)):
                if not t.is_nested:  # a nested tensor has no single shape
                    self._produced[id(t)] = (-1, t.shape)

    def forget(self) -> None:
        """Drop every remembered tensor id (plain ints: no tensor is kept)."""
        self._produced.clear()

    def _on_output(self, slot: int, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if output is None:
            exc = sys.exc_info()[1]
            if exc is not None:
                self._on_error(slot, module, args, exc)
            return
        if _is_compiling():
            return
        produced = self._produced
        if len(produced) > self._limit:
            produced.clear()
        if type(output) is torch.Tensor and not output.is_nested:
            produced[id(output)] = (slot, output.shape)
        else:
            for t in iter_tensors(output):
                if not t.is_nested:  # a nested tensor has no single shape
                    produced[id(t)] = (slot, t.shape)

    def producer(self, t: torch.Tensor, slot: int) -> str:
        hit = self._produced.get(id(t))
        if hit is not None and hit[1] == t.shape and hit[0] == -1:
            return "the model's input (the batch)"
        if not self.traced:
            return "not traced (the forward, run again to trace it, did not raise the same error)"
        if hit is not None and hit[1] == t.shape and hit[0] != slot:
            return f"module {self.names[hit[0]] or '<model>'!r} ({self.types[hit[0]]})"
        parent = self.names[slot].rpartition(".")[0] if self.names[slot] else None
        if parent is None:
            return "the caller (the model's input)"
        return f"functional code in the forward of {parent or '<model>'!r}, or the model's input"

    def _on_error(self, slot: int, module: nn.Module, args: tuple[Any, ...], exc: BaseException) -> None:
        if seen(exc) or not mark_seen(exc):
            return  # an exception type with __slots__: no note rather than a wrong one
        annotation = self.describe(slot, module, args, exc)
        if annotation is None:
            return
        if self._captured is not None:
            self._captured.append(annotation)
        else:
            self.apply(exc, annotation)

    def describe(self, slot: int, module: nn.Module, args: tuple[Any, ...],
                 exc: BaseException) -> Optional[Annotation]:
        """The note and finding for ``exc``, raised in the forward of ``module`` (at ``slot``)
        on ``args``; None when it is not a shape error or explains itself."""
        name = self.names[slot]
        shown = name or "<model>"
        if isinstance(exc, ShapeContractError):
            return Annotation(None, name, str(exc).splitlines()[0], {"contract": "expect()"})
        if isinstance(exc, SentinelError):
            return None  # the sentinel's own errors explain themselves
        contract, violation = layer_contract(name, module, args)
        if violation is None and not _SHAPE_WORDS.search(str(exc)):
            return None  # not a shape error: the note would only add noise
        tensors = [(i, t) for i, t in enumerate(iter_tensors(args))][:4]
        arrived = "; ".join(
            f"args[{i}] {_shape(t)} {str(t.dtype).replace('torch.', '')}, produced by {self.producer(t, slot)}"
            for i, t in tensors
        ) or "no tensor inputs"
        step = self.step()
        lines = [f"torch_sentinel: shape mismatch in module {shown!r} ({self.types[slot]})"
                 + (f" at step {step}" if step is not None else "")]
        if contract:
            lines.append(f"  contract: {contract}")
        if violation:
            lines.append(f"  {violation}")
        explained = _explain_message(str(exc))
        if explained:
            lines.append(f"  reading:  {explained}")
        elif len(tensors) >= 2 and violation is None:
            why = explain_broadcast(tuple(tensors[0][1].shape), tuple(tensors[1][1].shape))
            if why:
                lines.append(f"  reading:  {why}")
        lines.append(f"  arrived:  {arrived}")
        lines.append(f"  next:     {_NEXT}")
        return Annotation("\n".join(lines), name, violation or f"{type(exc).__name__}: {str(exc).splitlines()[0]}", {
            "contract": contract,
            "arrived": [list(map(int, t.shape)) for _, t in tensors],
            "produced_by": [self.producer(t, slot) for _, t in tensors],
            "module_type": self.types[slot],
        })

    def apply(self, exc: BaseException, annotation: Annotation, *, extra: Optional[str] = None) -> None:
        """Add the note to ``exc`` (with ``extra`` as its last line) and record the finding."""
        mark_seen(exc)
        if annotation.note is not None:
            note = annotation.note + (f"\n  {extra}" if extra else "")
            add_note = getattr(exc, "add_note", None)
            if add_note is not None:
                add_note(note)
            else:  # Python < 3.11
                exc.__notes__ = [*getattr(exc, "__notes__", []), note]
        self._record(annotation.module, annotation.message, annotation.evidence)

    def _record(self, name: str, message: str, evidence: dict[str, Any]) -> None:
        if self.on_finding is None:
            return
        self.on_finding(Finding(
            kind="shape_mismatch", boundary="shapes", message=message, module=name,
            step=self.step(), severity="error", evidence=evidence,
            next_check="name_the_axes_and_fix_the_layer_contract", rank=self.rank,
        ))

