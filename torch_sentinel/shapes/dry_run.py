"""A dry run on the meta device: every module's input and output shapes, with no compute and
no memory, stopping at the first mismatch with the same note an attached model gets.

    print(torch_sentinel.check_shapes(model, torch.empty(8, 32)))
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch
from torch import nn

from .._collect.hookset import HookSet
from .._collect.model_map import ModelMap
from .._collect.tensors import iter_tensors
from .notes import ShapeNotes

__all__ = ["ShapeRow", "ShapeTable", "check_shapes"]


def _shapes(obj: Any) -> list[tuple[int, ...]]:
    return [tuple(int(s) for s in t.shape) for t in iter_tensors(obj)]


def _fmt(shapes: list[tuple[int, ...]]) -> str:
    if not shapes:
        return "-"
    return ", ".join("(" + ", ".join(map(str, s)) + ("," if len(s) == 1 else "") + ")" for s in shapes)


@dataclasses.dataclass
class ShapeRow:
    module: str
    type: str
    inputs: list[tuple[int, ...]]
    outputs: list[tuple[int, ...]] = dataclasses.field(default_factory=list)
    depth: int = 0


@dataclasses.dataclass
class ShapeTable:
    """Rows in call order (a parent before its children). ``str()`` lays them out as a table."""

    rows: list[ShapeRow]

    def __getitem__(self, module: str) -> ShapeRow:
        for row in self.rows:
            if row.module == module:
                return row
        raise KeyError(module)

    def __str__(self) -> str:
        names = ["  " * r.depth + (r.module or "<model>") + f" ({r.type})" for r in self.rows]
        ins = [_fmt(r.inputs) for r in self.rows]
        outs = [_fmt(r.outputs) for r in self.rows]
        w0 = max([len("module"), *map(len, names)])
        w1 = max([len("inputs"), *map(len, ins)])
        lines = [f"{'module':{w0}}  {'inputs':{w1}}  outputs"]
        lines += [f"{n:{w0}}  {i:{w1}}  {o}" for n, i, o in zip(names, ins, outs)]
        return "\n".join(lines)


def _to_meta(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj if obj.device.type == "meta" else torch.empty_like(obj, device="meta")
    if isinstance(obj, tuple):
        return tuple(_to_meta(o) for o in obj)
    if isinstance(obj, list):
        return [_to_meta(o) for o in obj]
    if isinstance(obj, dict):
        return {k: _to_meta(v) for k, v in obj.items()}
    return obj


class _Recorder:
    def __init__(self, modules: list[tuple[str, nn.Module]]) -> None:
        self.rows: list[ShapeRow] = []
        self._open: list[ShapeRow] = []
        self._names = {id(m): n for n, m in modules}

    def before(self, name: str, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        row = ShapeRow(name, type(module).__name__, _shapes((args, kwargs)), depth=len(self._open))
        self.rows.append(row)
        self._open.append(row)

    def after(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self._open:
            row = self._open.pop()
            if output is not None:
                row.outputs = _shapes(output)


def check_shapes(model: nn.Module, *example_inputs: Any, **example_kwargs: Any) -> ShapeTable:
    """Run ``model`` on the meta device and return the per-module shape table.

    Inputs may live on any device (only their shapes and dtypes are used). Parameters and
    buffers are swapped for meta tensors during the call (``torch.func.functional_call``), so
    the model's own tensors are neither read nor changed. A shape error propagates with its
    original type and a note naming the module, its contract and the shapes that arrived; the
    rows recorded up to that point are in the note too.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"check_shapes() expected an nn.Module, got {type(model).__name__}")
    mm = ModelMap(model)
    root = mm.root
    recorder = _Recorder(mm.modules)
    hooks = HookSet()
    notes = ShapeNotes(mm.modules, hooks)
    try:
        for name, module in mm.modules:
            hooks.add(module.register_forward_pre_hook(functools.partial(recorder.before, name), with_kwargs=True))
            hooks.add(module.register_forward_hook(recorder.after, always_call=True))
        hooks.add(root.register_forward_pre_hook(
            lambda m, a, k: notes.seed(a, k), with_kwargs=True, prepend=True))
        state = {k: torch.empty_like(v, device="meta") for k, v in root.state_dict(keep_vars=True).items()
                 if isinstance(v, torch.Tensor)}
        args = _to_meta(example_inputs)
        kwargs = _to_meta(example_kwargs)
        try:
            # Tensors the forward creates itself (torch.arange for positions...) go to meta too.
            with torch.no_grad(), torch.device("meta"):
                torch.func.functional_call(root, state, args, kwargs, tie_weights=True, strict=False)
        except Exception as exc:
            notes_list = getattr(exc, "__notes__", None)
            if notes_list and any(n.startswith("torch_sentinel:") for n in notes_list):
                table = "torch_sentinel: dry-run shapes so far (meta device):\n" + str(ShapeTable(recorder.rows[-12:]))
                if hasattr(exc, "add_note"):
                    exc.add_note(table)
            raise
    finally:
        hooks.close()
    return ShapeTable(recorder.rows)
