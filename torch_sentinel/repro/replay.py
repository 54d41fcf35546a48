"""Replay an incident bundle: the same step, in immediate mode, with every module's evidence.

    result = torch_sentinel.replay("runs/exp/incidents/step_41.pt", MyModel())
    result.error        # the NonFiniteError the replay raised, or None
    result.reproduced   # same boundary and module as the original

The table lists, per module in forward order, whether its input, output and output gradient
were finite, and their norms, up to the first offender. Everything here is the cold path.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
from typing import Any, Callable, Optional, TextIO

import torch
from torch import nn

from .._collect.hookset import HookSet
from .._collect.model_map import ModelMap
from .._collect.tensors import iter_tensors
from .._errors import NonFiniteError, SentinelError, format_message
from .incident import BUNDLE_FORMAT, restore_rng

__all__ = ["ModuleEvidence", "ReplayResult", "load_bundle", "replay"]


def load_bundle(path: str) -> dict[str, Any]:
    try:
        bundle = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise SentinelError(format_message(
            f"cannot read incident bundle {path!r}",
            expected=f"a file written by torch_sentinel ({BUNDLE_FORMAT})",
            arrived=f"{type(exc).__name__}: {exc}",
            next_check="pass log_dir/incidents/step_<N>.pt from the failing run",
        )) from exc
    if not isinstance(bundle, dict) or bundle.get("format") != BUNDLE_FORMAT:
        raise SentinelError(format_message(
            f"{path!r} is not a torch_sentinel incident bundle",
            expected=f"format {BUNDLE_FORMAT!r}",
            arrived=repr(bundle.get("format")) if isinstance(bundle, dict) else type(bundle).__name__,
        ))
    return bundle


def _summary(obj: Any) -> tuple[Optional[bool], Optional[float]]:
    """(all finite, global L2 norm) over the floating tensors in ``obj``."""
    finite: Optional[bool] = None
    sq = 0.0
    for t in iter_tensors(obj):
        if not t.is_floating_point() or t.numel() == 0 or t.device.type == "meta":
            continue
        d = t.detach()
        ok = bool(torch.isfinite(d).all())
        finite = ok if finite is None else (finite and ok)
        sq += float(torch.linalg.vector_norm(d.double())) ** 2
    return finite, (math.sqrt(sq) if finite is not None else None)


@dataclasses.dataclass
class ModuleEvidence:
    module: str
    type: str
    input_finite: Optional[bool] = None
    input_norm: Optional[float] = None
    output_finite: Optional[bool] = None
    output_norm: Optional[float] = None
    grad_finite: Optional[bool] = None
    grad_norm: Optional[float] = None

    @property
    def ok(self) -> bool:
        return all(v is not False for v in (self.input_finite, self.output_finite, self.grad_finite))


class _EvidenceHooks:
    """Forward hooks (and output-gradient hooks) that fill one row per module, registered
    before the sentinel's so each row is complete when the sentinel raises."""

    def __init__(self, modules: list[tuple[str, nn.Module]], hooks: HookSet) -> None:
        self.rows: dict[str, ModuleEvidence] = {}
        self.order: list[str] = []
        for name, module in modules:
            hooks.add(module.register_forward_hook(functools.partial(self._forward, name), always_call=True))

    def _row(self, name: str, module: nn.Module) -> ModuleEvidence:
        row = self.rows.get(name)
        if row is None:
            row = self.rows[name] = ModuleEvidence(name, type(module).__name__)
            self.order.append(name)
        return row

    def _forward(self, name: str, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        row = self._row(name, module)
        row.input_finite, row.input_norm = _summary(args)
        if output is None:
            return
        row.output_finite, row.output_norm = _summary(output)
        for t in iter_tensors(output):
            if t.requires_grad:
                t.register_hook(functools.partial(self._grad, row))

    @staticmethod
    def _grad(row: ModuleEvidence, grad: torch.Tensor) -> None:
        finite, norm = _summary(grad)
        row.grad_finite = finite if row.grad_finite is None else (row.grad_finite and bool(finite))
        if norm is not None:
            row.grad_norm = math.sqrt((row.grad_norm or 0.0) ** 2 + norm**2)


def _cell(finite: Optional[bool], norm: Optional[float]) -> str:
    if finite is None:
        return "-"
    mark = "ok " if finite else "BAD"
    return f"{mark} {norm:.4g}" if norm is not None and math.isfinite(norm) else f"{mark} {norm}"


@dataclasses.dataclass
class ReplayResult:
    """What the replay found. ``rows`` are in forward order, up to the first offender."""

    bundle: dict[str, Any]
    rows: list[ModuleEvidence]
    error: Optional[NonFiniteError]
    backward: str

    @property
    def original(self) -> dict[str, Any]:
        return dict(self.bundle.get("error") or {})

    @property
    def reproduced(self) -> bool:
        o = self.original
        return self.error is not None and (self.error.boundary, self.error.module) == (o.get("boundary"), o.get("module"))

    def table(self) -> str:
        names = [r.module or "<model>" for r in self.rows]
        types = [r.type for r in self.rows]
        w0 = max([6, *map(len, names)])
        w1 = max([4, *map(len, types)])
        head = f"{'module':{w0}}  {'type':{w1}}  {'input':14}  {'output':14}  {'grad(output)':14}"
        lines = [head]
        offender = _offender(self.error)
        for r, n, t in zip(self.rows, names, types):
            mark = "  <- first offender" if r.module == offender else ""
            lines.append(f"{n:{w0}}  {t:{w1}}  {_cell(r.input_finite, r.input_norm):14}  "
                         f"{_cell(r.output_finite, r.output_norm):14}  {_cell(r.grad_finite, r.grad_norm):14}{mark}")
        return "\n".join(lines)

    def __str__(self) -> str:
        o = self.original
        lines = [
            f"replay of step {self.bundle.get('step')} (original: boundary {o.get('boundary')!r}, "
            f"module {o.get('module')!r}); parameters {self.bundle.get('params_note')}",
            f"backward: {self.backward}",
            "",
            self.table(),
            "",
        ]
        if self.error is None:
            lines.append("the replay did not reproduce a non-finite value: the fault depends on "
                         "something outside the bundle (parameters after the step, state of the "
                         "optimizer, the loss's targets)")
        else:
            verdict = "reproduced" if self.reproduced else "a different fault"
            lines.append(f"{verdict}: {str(self.error).splitlines()[0]}")
        return "\n".join(lines)


def _to(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, tuple):
        return tuple(_to(o, device) for o in obj)
    if isinstance(obj, list):
        return [_to(o, device) for o in obj]
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    return obj


def _offender(error: Optional[NonFiniteError]) -> Optional[str]:
    """The module whose row shows the fault first: for a non-finite value born in functional
    code, the submodule that first received it (the error itself names the enclosing module)."""
    if error is None:
        return None
    return str(error.evidence.get("first_nonfinite_output_of", error.module))


def _trim(rows: list[ModuleEvidence], error: Optional[NonFiniteError]) -> list[ModuleEvidence]:
    if error is None or error.boundary not in ("data", "forward"):
        return rows
    offender = _offender(error)
    for i, r in enumerate(rows):
        if r.module == offender or r.output_finite is False:
            return rows[: i + 1]
    return rows


def replay(
    bundle_path: str,
    model: nn.Module,
    *,
    loss_fn: Optional[Callable[[Any], torch.Tensor]] = None,
    verbose: bool = True,
    file: Optional[TextIO] = None,
) -> ReplayResult:
    """Re-run the step of an incident bundle on ``model`` in immediate mode.

    ``model`` is a fresh instance of the failing run's model class: the bundle's parameters
    and RNG states are loaded into it, its inputs fed to it, and a new sentinel attached with
    ``check="immediate"``. Backward runs on ``loss_fn(output)`` when given, on the output if
    it is a scalar (or has a ``.loss``), else on the surrogate ``output.sum()``: the loss's
    targets are not model inputs, so they are not in the bundle. Prints the evidence table
    unless ``verbose=False``.
    """
    from .._attach import attach  # import here: _api imports this package at attach time

    bundle = load_bundle(bundle_path)
    if not isinstance(model, nn.Module):
        raise TypeError(f"replay() expected the model (an nn.Module), got {type(model).__name__}")
    if bundle.get("params") is not None:
        try:
            model.load_state_dict(bundle["params"])
        except RuntimeError as exc:
            raise SentinelError(format_message(
                "the bundle's parameters do not fit this model",
                expected=f"a fresh {bundle.get('model_type')}",
                arrived=type(model).__name__,
                next_check="build the model exactly as the failing run did",
            )) from exc
    inputs = bundle.get("inputs")
    if inputs is None:
        raise SentinelError(format_message(
            "the bundle holds no inputs to replay",
            arrived=f"inputs of step {bundle.get('inputs_step')!r}",
            next_check="the batch was no longer held when the fault was found; rerun with check='immediate'",
        ))
    mm = ModelMap(model)
    device = next((p.device for _, p in mm.params), torch.device("cpu"))
    args, kwargs = _to(tuple(inputs["args"]), device), _to(dict(inputs["kwargs"]), device)
    model.train(bool(bundle.get("training", True)))
    hooks = HookSet()
    evidence = _EvidenceHooks(mm.modules, hooks)
    error: Optional[NonFiniteError] = None
    backward = "not run (the forward raised)"
    try:
        if bundle.get("rng"):
            restore_rng(bundle["rng"])
        with attach(model, None, check="immediate", on_nonfinite="raise"), torch.enable_grad():
            try:
                out = model(*args, **kwargs)
                if loss_fn is not None:
                    loss, backward = loss_fn(out), "loss_fn(output)"
                elif isinstance(getattr(out, "loss", None), torch.Tensor):
                    loss, backward = out.loss, "output.loss"
                elif isinstance(out, torch.Tensor) and out.numel() == 1:
                    loss, backward = out, "the scalar output"
                else:
                    first = next(iter_tensors(out))
                    loss, backward = first.float().sum(), "surrogate output.sum() (pass loss_fn for the real loss)"
                loss.backward()
            except NonFiniteError as exc:
                error = exc
    finally:
        hooks.close()
    rows = _trim([evidence.rows[n] for n in evidence.order], error)
    result = ReplayResult(bundle, rows, error, backward)
    if verbose:
        print(result, file=file or sys.stdout)
    return result
