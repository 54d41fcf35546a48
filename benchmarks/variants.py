"""What gets timed against the bare loop: torch_sentinel and the tools users reach for instead.

A variant instruments one model and optimizer at ``setup`` and undoes it at ``close``. The
training step itself is shared (see ``overhead.Contestant.step``); a variant can only wrap the
forward/backward in a context (``region``) or act between backward and the optimizer step
(``after_backward``), which is where each alternative does its work in real loops.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from typing import Any, ClassVar, Optional

import torch
from torch import nn

import torch_sentinel
from torch_sentinel._collect.tensors import iter_tensors
from torch_sentinel.facts import Activations

__all__ = ["DEFAULT_VARIANTS", "VARIANTS", "SentinelVariant", "Variant", "make_variant"]


class Variant:
    """The bare loop: instruments nothing."""

    name: ClassVar[str] = "bare"
    label: ClassVar[str] = "bare loop"

    def unavailable(self) -> Optional[str]:
        """Why this variant cannot run here, or None."""
        return None

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, workdir: str) -> None:
        self.model = model

    def region(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def after_backward(self, step: int) -> None:
        return None

    def before_audit(self) -> None:
        """Called before the sync audit, outside it: leave no pending cold-path work."""
        return None

    def close(self) -> None:
        return None


class SentinelVariant(Variant):
    """``torch_sentinel.attach`` with everything on; subclasses pick the options."""

    name = "sentinel"
    label = "torch_sentinel default (auto)"
    options: ClassVar[dict[str, Any]] = {}
    uses_log_dir: ClassVar[bool] = False

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, workdir: str) -> None:
        super().setup(model, optimizer, workdir)
        log_dir = os.path.join(workdir, self.name) if self.uses_log_dir else None
        self.sentinel = torch_sentinel.attach(model, optimizer, log_dir=log_dir, **self.options)

    def before_audit(self) -> None:
        self.sentinel.flush()

    def close(self) -> None:
        self.sentinel.detach()

    def describe(self) -> dict[str, Any]:
        """What was on, for the results: the check mode, detectors and sinks actually built."""
        s = self.sentinel
        return {
            "check_mode": s.check_mode,
            "detectors": sorted(type(d).__name__ for d in getattr(s, "_detectors", [])),
            "sinks": sorted(type(k).__name__ for k in getattr(s, "_sinks", [])),
        }

    def hooks_ran(self) -> bool:
        """Whether the forward hooks wrote this run's last landed row (under torch.compile,
        hooks can be silently skipped: see prior-art.md)."""
        self.sentinel.flush()
        recent = self.sentinel.recent_records()
        seen = recent[-1].fact(Activations) if recent else None
        return seen is not None and bool((seen.hi > -3.0e38).any())


class SentinelDeferred(SentinelVariant):
    name = "sentinel_deferred"
    label = "torch_sentinel check='deferred'"
    options: ClassVar[dict[str, Any]] = {"check": "deferred"}


class SentinelTensorBoard(SentinelVariant):
    name = "sentinel_tb"
    label = "torch_sentinel with log_dir (TensorBoard)"
    uses_log_dir = True


class DetectAnomaly(Variant):
    name = "detect_anomaly"
    label = "torch.autograd.detect_anomaly(check_nan=True)"

    def region(self) -> contextlib.AbstractContextManager[Any]:
        return _quiet_anomaly()


@contextlib.contextmanager
def _quiet_anomaly() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        # It warns on every entry that it slows training down; that is what is being measured.
        warnings.simplefilter("ignore", UserWarning)
        with torch.autograd.detect_anomaly(check_nan=True):
            yield


class NaiveHooks(Variant):
    """The hand-written NaN hook: one host read per output tensor of every module."""

    name = "naive_hooks"
    label = "per-module hooks, `if not isfinite(out).all(): raise`"

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, workdir: str) -> None:
        super().setup(model, optimizer, workdir)
        self.handles = [m.register_forward_hook(self._check) for m in model.modules()]

    @staticmethod
    def _check(module: nn.Module, args: Any, output: Any) -> None:
        for t in iter_tensors(output):
            if t.is_floating_point() and not torch.isfinite(t).all():
                raise RuntimeError(f"non-finite output in {type(module).__name__}")

    def close(self) -> None:
        for h in self.handles:
            h.remove()


class HFDebugOverflow(Variant):
    """transformers' ``DebugUnderflowOverflow``: per-module abs min/max and inf/nan host reads."""

    name = "hf_debug_overflow"
    label = "transformers DebugUnderflowOverflow"

    def unavailable(self) -> Optional[str]:
        if importlib.util.find_spec("transformers") is None:
            return "transformers is not installed"
        return None

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, workdir: str) -> None:
        super().setup(model, optimizer, workdir)
        from transformers.debug_utils import DebugUnderflowOverflow

        self.debug = DebugUnderflowOverflow(model)

    def close(self) -> None:
        for m in self.model.modules():
            # It keeps no handles; its hook is the only forward hook we did not add ourselves.
            for key, hook in list(m._forward_hooks.items()):
                if getattr(hook, "__self__", None) is self.debug:
                    del m._forward_hooks[key]


class GradNormLogging(Variant):
    """The common loop: every parameter's grad norm, read with ``.item()``, to a SummaryWriter."""

    name = "grad_norm_item"
    label = "per-parameter `grad.norm().item()` to SummaryWriter, every step"

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, workdir: str) -> None:
        super().setup(model, optimizer, workdir)
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(os.path.join(workdir, self.name))
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def after_backward(self, step: int) -> None:
        for n, p in self.named:
            if p.grad is not None:
                self.writer.add_scalar(f"grad_norm/{n}", p.grad.norm().item(), step)

    def close(self) -> None:
        self.writer.close()


class ClipGradNorm(Variant):
    name = "clip_grad_norm"
    label = "clip_grad_norm_(foreach=True)"

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, workdir: str) -> None:
        super().setup(model, optimizer, workdir)
        self.params = [p for p in model.parameters() if p.requires_grad]

    def after_backward(self, step: int) -> None:
        torch.nn.utils.clip_grad_norm_(self.params, 1.0, foreach=True)


class WandbWatch(Variant):
    """``wandb.watch(log="all")`` in offline mode. Its histograms are taken every
    ``LOG_FREQ`` steps, the same cadence as the sentinel's flush (``flush_every=50``)."""

    name = "wandb_watch"
    label = 'wandb.watch(log="all", log_freq=50), offline'
    LOG_FREQ = 50

    def unavailable(self) -> Optional[str]:
        if importlib.util.find_spec("wandb") is None:
            return "wandb is not installed (pip install wandb to include it)"
        return None

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, workdir: str) -> None:
        super().setup(model, optimizer, workdir)
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        # The global run: watch()'s hooks log through ``wandb.run``.
        self.run = wandb.init(mode="offline", dir=workdir, project="torch_sentinel_overhead")
        wandb.watch(model, log="all", log_freq=self.LOG_FREQ)

    def close(self) -> None:
        import wandb

        wandb.unwatch(self.model)
        self.run.finish()


VARIANTS: dict[str, type[Variant]] = {
    v.name: v
    for v in (
        Variant,
        SentinelVariant,
        SentinelDeferred,
        SentinelTensorBoard,
        DetectAnomaly,
        NaiveHooks,
        HFDebugOverflow,
        GradNormLogging,
        ClipGradNorm,
        WandbWatch,
    )
}
DEFAULT_VARIANTS = list(VARIANTS)


def make_variant(name: str) -> Variant:
    return VARIANTS[name]()
