"""The run manifest: what a run was, so that two runs can be compared factor by factor.

Written to ``log_dir/manifest.json`` at attach (writer rank only) and completed at detach with
the run's final figures. Everything here is a host fact read once: no device value.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from .._collect.tensors import materialized
from .._record import StepRecord
from .seed import determinism_flags, last_seed

__all__ = ["MANIFEST_NAME", "build_manifest", "finalize", "git_state", "load_manifest", "write_manifest"]

MANIFEST_NAME = "manifest.json"
_HYPERPARAMS_SKIPPED = {"params", "name"}


def _plain(value: Any) -> Any:
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bool, int)) or value is None:
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else repr(value)
    if isinstance(value, torch.Tensor):
        # An lr held as a tensor: read once at attach, a cold path, and only for 0-d ones.
        return _plain(value.item()) if value.numel() == 1 else f"tensor{tuple(value.shape)}"
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return repr(value)


def _versions() -> dict[str, Any]:
    cuda = torch.version.cuda
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "numpy": np.__version__,
        "cuda": cuda,
        "cudnn": cudnn,
        "hip": getattr(torch.version, "hip", None),
    }


def _devices(model: nn.Module) -> dict[str, Any]:
    types = sorted({p.device.type for p in model.parameters()} | {b.device.type for b in model.buffers()})
    names = []
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"model": types or ["cpu"], "accelerators": names, "cpu": platform.processor() or platform.machine()}


def git_state(cwd: Optional[str] = None, timeout: float = 5.0) -> Optional[dict[str, Any]]:
    """The commit and dirty state of the repository holding ``cwd``, or None outside one."""
    def run(*args: str) -> Optional[str]:
        try:
            out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = run("rev-parse", "HEAD")
    if commit is None:
        return None
    status = run("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status), "root": run("rev-parse", "--show-toplevel")}


def _optimizers(optimizers: Sequence[torch.optim.Optimizer]) -> list[dict[str, Any]]:
    out = []
    for opt in optimizers:
        groups = []
        for g in opt.param_groups:
            hp = {k: _plain(v) for k, v in g.items() if k not in _HYPERPARAMS_SKIPPED}
            hp["num_params"] = sum(p.numel() for p in g["params"] if materialized(p))
            if "name" in g:
                hp["name"] = str(g["name"])
            groups.append(hp)
        out.append({"type": f"{type(opt).__module__}.{type(opt).__qualname__}", "param_groups": groups})
    return out


def build_manifest(
    model: nn.Module,
    optimizers: Sequence[torch.optim.Optimizer],
    *,
    seed: Optional[int] = None,
    with_git: bool = True,
    rank: Optional[int] = None,
) -> dict[str, Any]:
    """Every factor of the run that can be read at attach. ``seed`` falls back to the one
    :func:`~torch_sentinel.seed_everything` set last."""
    source = "attach" if seed is not None else ("seed_everything" if last_seed() is not None else None)
    params = list(model.parameters())
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seed": seed if seed is not None else last_seed(),
        "seed_source": source,
        "versions": _versions(),
        "devices": _devices(model),
        "determinism": determinism_flags(),
        "git": git_state() if with_git else None,
        "command": [sys.executable, *sys.argv],
        "cwd": os.getcwd(),
        "model": {
            "type": f"{type(model).__module__}.{type(model).__qualname__}",
            # Lazy modules' parameters have no size before their first forward.
            "parameters": sum(p.numel() for p in params if materialized(p)),
            "trainable_parameters": sum(p.numel() for p in params if p.requires_grad and materialized(p)),
        },
        "optimizers": _optimizers(optimizers),
        "rank": rank,
    }


def finalize(manifest: dict[str, Any], records: Sequence[StepRecord], steps: int,
             findings: Sequence[Any] = ()) -> dict[str, Any]:
    """Add the run's final figures: steps, the last finite training and validation losses."""
    loss = validation = None
    loss_step = None
    for rec in reversed(records):
        value = rec.loss
        if loss is None and value is not None:
            loss, loss_step = float(value), rec.step
        if validation is None and rec.validation is not None:
            validation = float(rec.validation)
        if loss is not None and validation is not None:
            break
    manifest["result"] = {
        "steps": steps,
        "final_loss": _plain(loss),
        "final_loss_step": loss_step,
        "final_validation": _plain(validation),
        "findings": sorted({getattr(f, "kind", str(f)) for f in findings}),
    }
    return manifest


def write_manifest(log_dir: str, manifest: dict[str, Any]) -> str:
    os.makedirs(log_dir, exist_ok=True)
    path = os.path.join(log_dir, MANIFEST_NAME)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
    os.replace(tmp, path)  # a reader never sees half a manifest
    return path


def load_manifest(run: str) -> dict[str, Any]:
    """A run's manifest, from its log_dir or the manifest file itself."""
    path = os.path.join(run, MANIFEST_NAME) if os.path.isdir(run) else run
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"no {MANIFEST_NAME} at {path!r}: pass a log_dir written by attach(..., log_dir=...)"
        )
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path!r} is not a torch_sentinel manifest (expected a JSON object)")
    return data
