"""Incident bundles: a non-finite failure written down so that it can be replayed.

When a :class:`~torch_sentinel.NonFiniteError` is raised and ``log_dir`` is set,
``log_dir/incidents/step_<N>.pt`` holds the step, the model's inputs for it, the torch RNG states at
the start of its forward, the parameters (and whether they are from before the faulty step),
the last logged scalars, and the error's evidence. :func:`torch_sentinel.replay` re-runs it.

Hot path (only with ``log_dir``): at each training forward the root hook keeps a *reference*
to the inputs and the torch RNG states (no device read); the reference is dropped at the next
forward, so no batch outlives the step after its own. The CPU generator's state is the
collector's copy for that forward (``Collector.forward_rng``, shared with its rerun and the
shape notes), not a copy of its own.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import random
import weakref
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np
import torch

from .._collect.probe import Probe, ProbeHost
from .._errors import NonFiniteError
from .._record import StepMeta
from .view import SentinelView

__all__ = ["BUNDLE_FORMAT", "IncidentRecorder", "capture_rng", "restore_rng"]

logger = logging.getLogger("torch_sentinel")

BUNDLE_FORMAT = "torch_sentinel.incident/1"
#: Last logged scalars kept in a bundle.
SCALARS_KEPT = 32
#: Above this, parameters are left out of the bundle (a replay then needs the checkpoint).
PARAMS_LIMIT_BYTES = 2 << 30
_INTACT_BOUNDARIES = ("data", "forward", "loss", "gradients")


def capture_rng() -> dict[str, Any]:
    """The torch RNG states (CPU and CUDA), in a form ``torch.load(weights_only=True)`` accepts.

    Taken at every training forward, so only what a forward draws from: dropout and the other
    random ops use torch's generators. Python's and numpy's states are left out: reading them
    costs 0.1-0.5 ms (numpy copies its 624-word state into Python objects), more than the
    sentinel's whole budget for a small step, and a forward almost never draws from them.
    """
    return _with_cuda({"torch": torch.get_rng_state()})


def _with_cuda(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` plus every CUDA device's generator state, if CUDA is in use (host values:
    a CUDA generator's state is its seed and offset)."""
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.int64).astype(np.uint32), int(pos), int(has_gauss), float(cached)))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _to_cpu(obj: Any, depth: int = 0) -> Any:
    """The batch as plain containers of CPU tensors (cold path: copies device tensors)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if depth > 6:
        return None
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, tuple):
        return tuple(_to_cpu(o, depth + 1) for o in obj)
    if isinstance(obj, list):
        return [_to_cpu(o, depth + 1) for o in obj]
    if isinstance(obj, Mapping):  # BatchEncoding and other dict-likes become dicts
        return {str(k): _to_cpu(v, depth + 1) for k, v in obj.items()}
    return None  # an object torch.load(weights_only=True) could not read back


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return str(value)  # also for str subclasses (torch's TorchVersion) weights_only refuses
    if isinstance(value, (int, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return repr(value)


@dataclasses.dataclass
class _Capture:
    step: int
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    rng: dict[str, Any]
    training: bool


class IncidentRecorder(Probe):
    """Keeps the current step's batch and RNG states, and writes the bundle on a NonFiniteError."""

    def __init__(self, sentinel: SentinelView, log_dir: str) -> None:
        self._sentinel = sentinel
        self.log_dir = log_dir
        self._current: Optional[_Capture] = None
        self._previous: Optional[_Capture] = None
        self.written: list[str] = []
        #: The collector, weakly: this recorder is the sentinel's, and a kept sentinel must not
        #: keep a dropped model (``_model_side.py``).
        self._host: Optional[weakref.ref[ProbeHost]] = None
        sentinel.add_probe(self)
        sentinel.on_nonfinite_callbacks.append(self._on_error)

    def setup(self, host: ProbeHost) -> None:
        self._host = weakref.ref(host)

    def on_root_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if torch.compiler.is_compiling():
            return
        self._previous = None
        # The CPU state the collector copied at this forward's entry (this event is delivered
        # there, so the moment is the same). CUDA states are read for every device, not only
        # the model's, which is all the collector keeps: a replay restores them all.
        host = self._host() if self._host is not None else None
        rng = _with_cuda({"torch": host.forward_rng()[0]}) if host is not None else capture_rng()
        self._current = _Capture(self._sentinel.step, args, kwargs, rng, self._sentinel.root.training)

    def on_row_close(self, meta: StepMeta) -> None:
        # The step is complete; keep its batch only until the next forward, for a deferred
        # check that judges the row right after it closes.
        if self._current is not None:
            self._previous, self._current = self._current, None

    def _capture_for(self, step: int) -> Optional[_Capture]:
        for cap in (self._current, self._previous):
            if cap is not None and cap.step == step:
                return cap
        return self._current or self._previous

    def _on_error(self, err: NonFiniteError, sentinel: SentinelView) -> None:
        try:
            self.written.append(self.write(err))
        finally:
            self._current = self._previous = None

    def bundle(self, err: NonFiniteError) -> dict[str, Any]:
        s = self._sentinel
        cap = self._capture_for(err.step)
        intact = s.check_mode == "immediate" and err.boundary in _INTACT_BOUNDARIES and s.step == err.step
        params: Optional[dict[str, torch.Tensor]] = None
        state = s.root.state_dict()
        size = sum(t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor))
        if size <= PARAMS_LIMIT_BYTES:
            params = {k: v.detach().to("cpu", copy=True) for k, v in state.items() if isinstance(v, torch.Tensor)}
        if intact:
            params_note = "from before the faulty step (it raised before optimizer.step)"
        else:
            params_note = (f"from after optimizer step {s.step - 1}: the fault was found after the "
                           f"faulty step {err.step} had updated them (check='deferred')"
                           if s.step > err.step else "state at the time the error was raised")
        if params is None:
            params_note = f"left out: {size / 2**20:.0f} MiB exceeds the bundle limit; load your checkpoint"
        return {
            "format": BUNDLE_FORMAT,
            "step": err.step,
            "rank": err.rank,
            "check_mode": s.check_mode,
            "inputs": None if cap is None else {"args": _to_cpu(cap.args), "kwargs": _to_cpu(cap.kwargs)},
            "inputs_step": None if cap is None else cap.step,
            "training": True if cap is None else cap.training,
            "rng": None if cap is None else cap.rng,
            "rng_note": "at the start of the step's forward (the root module's pre-hook)",
            "params": params,
            "params_before_faulty_step": bool(intact and params is not None),
            "params_note": params_note,
            "scalars": self._scalars(),
            "error": {
                "type": type(err).__name__,
                "message": str(err),
                "boundary": err.boundary,
                "module": err.module,
                "step": err.step,
                "nan": err.nan, "posinf": err.posinf, "neginf": err.neginf,
                "shape": list(err.shape) if err.shape is not None else None,
                "dtype": err.dtype,
                "evidence": _plain(err.evidence),
            },
            "model_type": f"{type(s.root).__module__}.{type(s.root).__qualname__}",
            "manifest": _plain(s.manifest),
        }

    def _scalars(self) -> list[dict[str, Any]]:
        out = []
        for rec in self._sentinel.recent_records()[-SCALARS_KEPT:]:
            grads = rec.array("grad_norm").astype(np.float64) if rec.has("grad_norm") else np.zeros(0)
            out.append(_plain({
                "step": rec.step,
                "loss": rec.loss,
                "validation": rec.validation,
                "lrs": list(rec.meta.lrs),
                "grad_norm": float(np.sqrt((grads**2).sum())) if grads.size else None,
            }))
        return out

    def write(self, err: NonFiniteError) -> str:
        folder = os.path.join(self.log_dir, "incidents")
        os.makedirs(folder, exist_ok=True)
        suffix = f"_rank{err.rank}" if err.rank is not None else ""
        path = os.path.join(folder, f"step_{err.step}{suffix}.pt")
        torch.save(self.bundle(err), path)
        logger.warning("torch_sentinel: incident bundle written to %s (replay: torch-sentinel replay %s)",
                       path, path)
        return path

