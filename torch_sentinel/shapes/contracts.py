"""Named-axis shape contracts: write what each axis means, and let a mismatch say which one.

    torch_sentinel.expect(model.decoder, input="B F", output="B H")

    @torch_sentinel.expect(x="B F", w="F H", returns="B H")
    def linear(x, w): ...

A spec is a space-separated list of axes: a name (``B``) binds to a size the first time it is
seen and must agree everywhere after it in the same call; an integer (``3``) is a fixed size;
``_`` is any single size; ``...`` is any number of leading axes. Checking reads only
``.shape``: no tensor op, no device read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Optional, TypeVar, Union

from .._errors import ShapeContractError, format_message

__all__ = ["Axes", "Contract", "Spec", "explain_broadcast", "rank_hint"]

Spec = Union[str, Sequence[str], Mapping[str, str]]
F = TypeVar("F", bound=Callable[..., Any])

_ELLIPSIS = "..."
_ANY = "_"


def _fmt_shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def explain_broadcast(a: Sequence[int], b: Sequence[int]) -> Optional[str]:
    """Why two shapes do not broadcast, reasoned right to left as broadcasting does; None if
    they do. ``explain_broadcast((32, 4), (32,))`` -> "trailing dimensions compare as 4 and 32..."."""
    a, b = tuple(a), tuple(b)
    for k in range(1, min(len(a), len(b)) + 1):
        x, y = a[-k], b[-k]
        if x == y or x == 1 or y == 1:
            continue
        which = "trailing dimensions" if k == 1 else f"dimensions at position {-k}"
        text = (
            f"{_fmt_shape(a)} and {_fmt_shape(b)} do not broadcast: compared right to left, the "
            f"{which} compare as {x} and {y}, which are neither equal nor 1"
        )
        if len(b) == 1 and len(a) >= 2 and b[0] == a[-2]:
            text += (f"; if the intent is one value per row, reshape explicitly: "
                     f".reshape({b[0]}, 1) gives {_fmt_shape((b[0], 1))}")
        elif len(a) == 1 and len(b) >= 2 and a[0] == b[-2]:
            text += (f"; if the intent is one value per row, reshape explicitly: "
                     f".reshape({a[0]}, 1) gives {_fmt_shape((a[0], 1))}")
        return text
    return None


def rank_hint(got: Sequence[int], want: Sequence[int]) -> Optional[str]:
    """The reshape that probably was intended when ``got`` and ``want`` hold the same values
    with different ranks: (n,), (1, n) and (n, 1) are different shapes."""
    got, want = tuple(got), tuple(want)
    if got == want:
        return None
    squeezed_got = tuple(s for s in got if s != 1)
    squeezed_want = tuple(s for s in want if s != 1)
    if squeezed_got != squeezed_want:
        return None
    if len(got) < len(want):
        how = ".unsqueeze(-1)" if want[-1] == 1 else ".unsqueeze(0)" if want[0] == 1 else f".reshape{_fmt_shape(want)}"
    elif len(got) > len(want):
        how = ".squeeze(-1)" if got[-1] == 1 else ".squeeze(0)" if got[0] == 1 else f".reshape{_fmt_shape(want)}"
    else:
        how = f".reshape{_fmt_shape(want)}"
    return (f"{_fmt_shape(got)} and {_fmt_shape(want)} hold the same values with different "
            f"ranks; {how} gives {_fmt_shape(want)}")


@dataclasses.dataclass(frozen=True)
class Axes:
    """One parsed spec: its axes, and where the ``...`` sits (None if absent)."""

    text: str
    axes: tuple[str, ...]
    ellipsis: Optional[int]

    @classmethod
    def parse(cls, text: str) -> Axes:
        if not isinstance(text, str):
            raise TypeError(f"a shape spec must be a str such as 'B F', got {type(text).__name__}")
        axes = tuple(text.replace(",", " ").split())
        dots = [i for i, a in enumerate(axes) if a == _ELLIPSIS]
        if len(dots) > 1:
            raise ValueError(f"shape spec {text!r} has more than one '...'")
        for a in axes:
            if a not in (_ELLIPSIS, _ANY) and not a.isidentifier() and not a.isdigit():
                raise ValueError(
                    f"shape spec {text!r}: axis {a!r} is neither a name, a size, '_' nor '...'"
                )
        return cls(text, axes, dots[0] if dots else None)

    def align(self, shape: tuple[int, ...]) -> Optional[list[tuple[str, int, int]]]:
        """(axis, size, dim) pairs, or None when the rank cannot match."""
        if self.ellipsis is None:
            if len(shape) != len(self.axes):
                return None
            return [(a, s, d) for d, (a, s) in enumerate(zip(self.axes, shape))]
        head = self.axes[: self.ellipsis]
        tail = self.axes[self.ellipsis + 1 :]
        if len(shape) < len(head) + len(tail):
            return None
        pairs = [(a, shape[d], d) for d, a in enumerate(head)]
        start = len(shape) - len(tail)
        pairs += [(a, shape[start + i], start + i) for i, a in enumerate(tail)]
        return pairs

    def expected(self, bound: Mapping[str, tuple[int, str]]) -> str:
        """The spec with bound sizes filled in, e.g. '(B=8, F=16)'."""
        parts = []
        for a in self.axes:
            if a in bound:
                parts.append(f"{a}={bound[a][0]}")
            else:
                parts.append(a)
        return "(" + ", ".join(parts) + ")"


@dataclasses.dataclass
class _Mismatch:
    axis: str
    dim: int
    arrived: int
    expected: int
    bound_by: Optional[str]


class Contract:
    """Named-axis specs for a call's inputs and outputs; :meth:`check` binds and compares.

    ``where`` names the call in messages (a module path or a function name).
    """

    def __init__(self, where: str, inputs: Mapping[str, str], outputs: Mapping[str, str]) -> None:
        self.where = where
        self.inputs = {k: Axes.parse(v) for k, v in inputs.items()}
        self.outputs = {k: Axes.parse(v) for k, v in outputs.items()}

    def describe(self) -> str:
        ins = ", ".join(f"{k}={v.text!r}" for k, v in self.inputs.items())
        outs = ", ".join(f"{k}={v.text!r}" for k, v in self.outputs.items())
        return f"inputs {ins or '-'}; outputs {outs or '-'}"

    def check(self, label: str, value: Any, spec: Axes, bound: dict[str, tuple[int, str]]) -> None:
        """Bind ``spec``'s names on ``value``'s shape, or raise :class:`ShapeContractError`."""
        shape = getattr(value, "shape", None)
        if shape is None:
            raise ShapeContractError(format_message(
                f"shape contract of {self.where}: {label} has no shape",
                expected=f"a tensor shaped {spec.text!r}",
                arrived=type(value).__name__,
                where=f"{self.where} ({self.describe()})",
                next_check="pass a tensor, or drop this name from the contract",
            ))
        shape = tuple(int(s) for s in shape)
        pairs = spec.align(shape)
        if pairs is None:
            self._rank_error(label, shape, spec, bound)
        mismatches: list[_Mismatch] = []
        fresh: dict[str, tuple[int, str]] = {}
        for axis, size, dim in pairs:  # type: ignore[union-attr]
            if axis == _ANY:
                continue
            if axis.isdigit():
                if size != int(axis):
                    mismatches.append(_Mismatch(axis, dim, size, int(axis), None))
                continue
            known = bound.get(axis) or fresh.get(axis)
            if known is None:
                fresh[axis] = (size, f"{label} dim {dim}")
            elif known[0] != size:
                mismatches.append(_Mismatch(axis, dim, size, known[0], known[1]))
        if mismatches:
            self._axis_error(label, shape, spec, bound, mismatches)
        bound.update(fresh)

    # -- messages ---------------------------------------------------------------------------
    def _rank_error(self, label: str, shape: tuple[int, ...], spec: Axes,
                    bound: Mapping[str, tuple[int, str]]) -> None:
        want = len(spec.axes) - (1 if spec.ellipsis is not None else 0)
        rank_txt = f"at least {want}" if spec.ellipsis is not None else str(want)
        hint = None
        if spec.ellipsis is None and all(a in bound or a.isdigit() for a in spec.axes):
            target = tuple(bound[a][0] if a in bound else int(a) for a in spec.axes)
            hint = rank_hint(shape, target)
        next_check = hint or (
            "(n,), (1, n) and (n, 1) are different shapes: add or remove the axis explicitly "
            "(unsqueeze/squeeze/reshape), do not rely on broadcasting")
        raise ShapeContractError(format_message(
            f"shape contract of {self.where} violated: {label} has rank {len(shape)}, "
            f"expected rank {rank_txt} ({spec.text!r})",
            expected=f"{label} shaped {spec.expected(bound)}",
            arrived=f"{label} of shape {_fmt_shape(shape)}",
            where=f"{self.where} ({self.describe()})",
            next_check=next_check,
        ))

    def _axis_error(self, label: str, shape: tuple[int, ...], spec: Axes,
                    bound: Mapping[str, tuple[int, str]], mismatches: list[_Mismatch]) -> None:
        names = ", ".join(
            f"{m.axis} ({m.arrived} vs {m.expected}" + (f" bound by {m.bound_by})" if m.bound_by else ")")
            for m in mismatches
        )
        first = mismatches[0]
        k = len(shape) - first.dim
        which = "trailing dimensions" if k == 1 else f"dimensions at position {-k}"
        source = f"{first.axis} from {first.bound_by}" if first.bound_by else "fixed by the contract"
        reason = (f"compared right to left, the {which} compare as {first.expected} ({source}) "
                  f"and {first.arrived} ({label})")
        if first.axis.isdigit():
            headline = (f"shape contract of {self.where} violated: {label} dim {first.dim} is "
                        f"{first.arrived}, but the contract fixes it to {first.expected}")
        else:
            headline = (f"shape contract of {self.where} violated: axis {first.axis} of {label} is "
                        f"{first.arrived}, but {first.axis} = {first.expected} from {first.bound_by}")
        raise ShapeContractError(format_message(
            headline,
            expected=f"{label} shaped {spec.expected(bound)}",
            arrived=f"{label} of shape {_fmt_shape(shape)}; axes that disagree: {names}; {reason}",
            where=f"{self.where} ({self.describe()})",
            next_check=("name what each axis means and fix the producer of this tensor; do not "
                        "reshape until the axes agree with the contract"),
        ))
