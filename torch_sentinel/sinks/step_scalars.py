"""One step record as TensorBoard's ``(tag, value)`` pairs: pure host numpy, no writer.

Shared by the TensorBoard sink and the framework-logger sink (Lightning, HF), so both spell
the same tags from the same figures.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Optional

import numpy as np

from .._collect.amp import LossScale
from .._collect.probes.forward import Activations
from .._collect.probes.norms import GradNorms, WeightNorms
from .._collect.probes.updates import UpdateNorms
from .._collect.rungs import nonfinite_counts
from .._record import StepRecord

__all__ = ["ROOT_TAG", "StepScalars", "module_tag"]

#: How the root module (whose qualified name is empty) appears in tags.
ROOT_TAG = "<model>"


def module_tag(name: str) -> str:
    return name or ROOT_TAG


class StepScalars:
    """Turns one :class:`StepRecord` into ``(tag, value)`` pairs: pure host numpy, no writer.

    Per-module figures aggregate the per-parameter slots over each module's own parameters
    (sqrt of the sum of squares), so ``grad_norm/<module>`` is the norm of that module's
    gradient and ``grad_norm/global`` the norm of the whole model's.
    """

    def __init__(self, param_owner: dict[str, str]) -> None:
        self.param_owner = param_owner
        self._keys: Optional[list[str]] = None

    def _layout(self, keys: list[str]) -> None:
        """Group parameter slots by owning module once; the parameter blocks never change."""
        self._keys = keys
        self._index = {k: i for i, k in enumerate(keys)}
        owners = [self.param_owner.get(k, k.rpartition(".")[0]) for k in keys]
        self._modules = list(dict.fromkeys(owners))
        pos = {m: i for i, m in enumerate(self._modules)}
        self._owner_idx = np.array([pos[o] for o in owners], dtype=np.int64)
        tags = [module_tag(m) for m in self._modules]
        self._grad_tags = [f"grad_norm/{t}" for t in tags]
        self._ratio_tags = [f"update_ratio/{t}" for t in tags]

    def scalars(
        self,
        record: StepRecord,
        module_names: Sequence[str],
        amp_skipped: Optional[int] = None,
        *,
        global_tags: bool = True,
        module_tags: bool = True,
    ) -> Iterator[tuple[str, float]]:
        """``amp_skipped`` is the count of steps the GradScaler skipped so far, None before any
        AMP step (the AMP tags then stay absent). ``global_tags`` / ``module_tags`` select the
        whole-model tags and the per-module ones (``<kind>/<module>``)."""
        if global_tags:
            yield from self._global_scalars(record, amp_skipped)
        grads = record.fact(GradNorms)
        if grads is not None:
            yield from self._param_scalars(record, grads, global_tags, module_tags)
        if module_tags:
            yield from self._module_activations(record, module_names)

    def _global_scalars(
        self, record: StepRecord, amp_skipped: Optional[int]
    ) -> Iterator[tuple[str, float]]:
        meta = record.meta
        loss = record.loss
        if loss is not None:
            yield "loss/train", loss
        for name, lr in zip(meta.lr_names, meta.lrs):
            if lr is not None:
                yield f"lr/{name}", lr
        for boundary, bad in nonfinite_counts(record).items():
            yield f"nonfinite/{boundary}", float(bad)
        if amp_skipped is not None:
            yield "amp/skipped_steps", float(amp_skipped)
            scaled = record.fact(LossScale)
            if scaled is not None and scaled.scale > 0:
                yield "amp/loss_scale", scaled.scale

    def _module_activations(
        self, record: StepRecord, module_names: Sequence[str]
    ) -> Iterator[tuple[str, float]]:
        seen = record.fact(Activations)
        if seen is not None:
            lo, hi = seen.lo, seen.hi
            absmax = np.maximum(np.abs(lo), np.abs(hi))
            # A module that did not run this step keeps its slots at (+max, -max): lo > hi.
            for i in np.flatnonzero(~(lo > hi)).tolist():
                if i < len(module_names):
                    yield f"activation_absmax/{module_tag(module_names[i])}", float(absmax[i])

    def _param_scalars(
        self, record: StepRecord, grads: GradNorms, global_tags: bool, module_tags: bool
    ) -> Iterator[tuple[str, float]]:
        keys = list(grads.names)
        if self._keys is not grads.names and self._keys != keys:
            self._layout(keys)
        n_modules = len(self._modules)
        present = np.ones(len(keys), dtype=bool)
        for name in grads.missing:
            j = self._index.get(name)
            if j is not None:
                present[j] = False
        if present.any():
            # Before clipping, as clip_grad_norm_ saw them (see _collect/probes/clip.py).
            g = grads.values
            sq = np.bincount(self._owner_idx[present], weights=g[present] ** 2, minlength=n_modules)
            has = np.bincount(self._owner_idx[present], minlength=n_modules) > 0
            if global_tags:
                yield "grad_norm/global", math.sqrt(float(sq.sum()))
                if grads.clipped is not None:
                    post = grads.clipped[present]
                    yield "grad_norm/global_clipped", math.sqrt(float((post**2).sum()))
            if module_tags:
                norms = np.sqrt(sq).tolist()  # float64, as math.sqrt: the same values
                tags = self._grad_tags
                for i in np.flatnonzero(has).tolist():
                    yield tags[i], norms[i]
        updates, weights = record.fact(UpdateNorms), record.fact(WeightNorms)
        if updates is not None and weights is not None:
            u, w = updates.values, weights.values
            usq = np.bincount(self._owner_idx, weights=u**2, minlength=n_modules)
            wsq = np.bincount(self._owner_idx, weights=w**2, minlength=n_modules)
            if global_tags and wsq.sum() > 0:
                yield "update_ratio/global", math.sqrt(float(usq.sum()) / float(wsq.sum()))
            if module_tags:
                tags = self._ratio_tags
                for i in np.flatnonzero(wsq > 0).tolist():
                    yield tags[i], math.sqrt(float(usq[i] / wsq[i]))
