"""Gradient and weight norms of every parameter before the update, and stale gradients.

One ``_foreach_norm`` at the optimizer's pre-step serves two boundaries: the gradients of this
step, and (since the weights before step k are the weights after step k-1) the update of the
previous step. At the first backward of a step, gradients already present were not cleared:
their total norm goes into ``misc.stale_grad_norm``.
"""

from __future__ import annotations

import dataclasses
import operator
import warnings
from collections.abc import Hashable, Sequence
from typing import Optional

import numpy as np
import torch

from ..._record import Fact, StepRecord
from ..cadence import sampled
from ..ledger import FLOAT_MAX
from ..norm_groups import GroupPlan, dense_grads, grouped_norms, groups_on
from ..probe import Probe, ProbeHost
from ..shards import ShardedNorms, local
from ..tensors import NATIVE_DTYPES, all_finite, foreach_norms, materialized, reduces
from .clip import preclip

__all__ = ["GradNorms", "NormsProbe", "StaleGradients", "WeightNorms"]


@dataclasses.dataclass(frozen=True)
class GradNorms(Fact):
    """The L2 norm of each watched parameter's gradient at the optimizer step, **before**
    clipping (what ``clip_grad_norm_`` saw; unscaled under AMP once the scaler unscaled them)."""

    #: Parameter names, in the order of ``values`` (model parameters, then optimizer-only ones).
    names: Sequence[str]
    #: float64; 0 for a parameter without a gradient (see ``missing``).
    values: np.ndarray
    #: The norms after the step's clip calls, where the loop clipped (else None).
    clipped: Optional[np.ndarray]
    #: Parameters that had no ``.grad`` at the step.
    missing: tuple[str, ...]
    #: Parameters that did not require grad at the step.
    frozen: tuple[str, ...]

    def by_name(self) -> dict[str, float]:
        return dict(zip(self.names, self.values.tolist()))

    @property
    def at_step(self) -> np.ndarray:
        """The norms the optimizer step saw: after the step's clip calls, where there were any."""
        return self.clipped if self.clipped is not None else self.values

    @property
    def total(self) -> float:
        """The global norm over every parameter (what a clip over the whole model saw)."""
        return float(np.sqrt((self.values**2).sum()))


@dataclasses.dataclass(frozen=True)
class WeightNorms(Fact):
    """The L2 norm of each watched weight as the optimizer step found it (the previous step's
    result), on the steps that read them (``cadence.py``; every step in deferred mode)."""

    names: Sequence[str]
    #: float64.
    values: np.ndarray

    def by_name(self) -> dict[str, float]:
        return dict(zip(self.names, self.values.tolist()))


@dataclasses.dataclass(frozen=True)
class StaleGradients(Fact):
    """Gradients already present at the step's first backward: they were not cleared since
    the previous step."""

    #: How many parameters held a gradient.
    count: int
    #: Their total L2 norm.
    norm: float


class NormsProbe(Probe):
    name = "norms"
    publishes = (GradNorms, WeightNorms, StaleGradients)

    def __init__(self, update_every: int = 0) -> None:
        self.update_every = update_every

    def setup(self, host: ProbeHost) -> None:
        self.host = host
        pnames = [n for n, _ in host.params]
        self.grad_block = host.ledger.add_block("grad_norm", pnames)
        # Right after grad_norm: one _foreach_norm fills both blocks.
        self.param_block = host.ledger.add_block("param_norm", pnames)
        assert self.param_block.start == self.grad_block.stop
        tensors = host.param_tensors
        self._same_device = all(p.device == host.device for p in tensors)
        self.sharded = ShardedNorms(tensors)
        self._sharded_pairs = ShardedNorms(tensors + tensors)
        self._missing_index_cache: dict[tuple[int, ...], torch.Tensor] = {}
        #: dtypes already warned about (no norm for them on this device).
        self._skipped: set[torch.dtype] = set()
        #: The step whose row holds a stale-gradient norm (it may have to be taken back).
        self._stale_step = -1
        #: Small tensors are normed in stacked groups (see _grouped_norms): CPU rows only.
        self._grouping = self._same_device and groups_on(host.device)
        self._group_plans_cache: dict[Hashable, GroupPlan] = {}
        host.provide(GradNorms, _grad_norms)
        host.provide(WeightNorms, _weight_norms)
        host.provide(StaleGradients, _stale_gradients)

    # -- events ---------------------------------------------------------------------------
    def on_backward(self, loss: torch.Tensor) -> None:
        if self.host.meta.backward_calls == 1:
            self._check_stale_grads()

    def on_pre_step(self, optimizer: torch.optim.Optimizer) -> None:
        host = self.host
        grads = dense_grads(host.param_tensors)
        if self._weights_due():
            # The parameters themselves: the hook runs under no_grad. A detach would be one new
            # tensor object a parameter, for the garbage collector to count.
            weights: list[Optional[torch.Tensor]] = [
                p if materialized(p) else None for p in host.param_tensors
            ]
            missing = self.copy_norms(self.grad_block.start, grads + weights, self._sharded_pairs)
            host.meta.weights_recorded = True
        else:
            missing = self.copy_norms(self.grad_block.start, grads, self.sharded)
        host.meta.grad_missing = tuple(host.params[i][0] for i in missing)
        if all(map(_REQUIRES_GRAD, host.param_tensors)):  # the usual case, in one C-level pass
            host.meta.frozen = ()
        else:
            host.meta.frozen = tuple(n for n, p in host.params if not p.requires_grad)

    # -- helpers --------------------------------------------------------------------------
    def _check_stale_grads(self) -> None:
        """Gradients already present before a step's first backward were not cleared."""
        host = self.host
        # Local shards of sharded gradients: finiteness is what matters here, not the global norm.
        # Only trainable parameters: a frozen one keeps whatever .grad it last had (an earlier
        # phase's, e.g. a backbone pretrained and then frozen), which nothing adds to.
        params = host.param_tensors
        if not all(map(_REQUIRES_GRAD, params)):  # the usual case in one C-level pass
            params = [p for p in params if p.requires_grad]
        stale = [local(g) for g in dense_grads(params) if g is not None]
        host.meta.stale_grads = len(stale)
        stale = [g for g in stale if reduces(g.dtype, g.device)]
        if stale and host.step > 0:
            with torch.no_grad():
                norms = foreach_norms(stale)
                total = torch.linalg.vector_norm(torch.stack([n.to(host.device) for n in norms]))
                host.ledger.views[host.ledger.block("misc").start].copy_(total)
            self._stale_step = host.step

    def on_cleared(self) -> None:
        """The gradients were cleared after this step's first backward (which is dropped):
        what it measured as stale is not."""
        host = self.host
        host.meta.stale_grads = 0
        if self._stale_step == host.step:
            host.ledger.views[host.ledger.block("misc").start].zero_()
            self._stale_step = -1

    def _weights_due(self) -> bool:
        """Whether this step reads every weight for its norm.

        Deferred mode needs them every step: the row is the only evidence that an update made
        a weight non-finite. Immediate mode finds that exactly without them: the first forward
        that uses such a weight goes non-finite, and its hook checks that module's weights on
        the spot (``ForwardProbe._fault``). There they are read on sampled steps and the step after
        each (pairs: what ``no_update`` compares; ``cadence.py``), and with every sampled update:
        a pass over all weights saved on most steps.
        """
        if not self.host.immediate or self.host.traced:
            return True
        step = self.host.step
        return sampled(step) or sampled(step - 1) or bool(self.update_every and step % self.update_every == 0)

    def copy_norms(self, block_start: int, tensors: list[Optional[torch.Tensor]], sharded: ShardedNorms) -> list[int]:
        """L2 norms of ``tensors`` into consecutive slots from ``block_start``; the indices of
        the tensors that are None (their slots are left alone) are returned."""
        host = self.host
        n = len(tensors)
        # Every step runs this over every parameter: C-level passes (map, list.count-free
        # comprehensions) where the common case (all present, float32) allows.
        present = [i for i, t in enumerate(tensors) if t is not None]
        if not present:
            return list(range(n))
        if sharded:
            tensors = [None if t is None else local(t) for t in tensors]
        chosen: list[torch.Tensor] = (
            tensors if len(present) == n else [tensors[i] for i in present]  # type: ignore[assignment,misc]
        )
        dtypes = set(map(_DTYPE, chosen))
        if not dtypes <= NATIVE_DTYPES:
            # A dtype torch has no norm for (float8 weights) keeps its slot's initial value:
            # skipped, with one warning, not reported as a missing gradient.
            unsupported = [i for i in present if not reduces(tensors[i].dtype, tensors[i].device)]  # type: ignore[union-attr]
            if unsupported:
                self._skip(tensors, unsupported)
                dropped = set(unsupported)
                present = [i for i in present if i not in dropped]
                if not present:
                    return [i for i in range(n) if tensors[i] is None]
                chosen = [tensors[i] for i in present]  # type: ignore[misc]
        if len(present) == n and dtypes == _FLOAT32 and not sharded and self._grouping:
            self._grouped_norms(chosen, host.ledger.current[block_start : block_start + n])
            if host.ledger.host_view is not None:
                self._confirm_norm_overflow(block_start, tensors)
                self._confirm_norm_underflow(block_start, tensors)  # never sharded here
            return []
        # All float32: the one plain _foreach_norm that foreach_norms would run, without its scan.
        norms = list(torch._foreach_norm(chosen)) if dtypes == _FLOAT32 else foreach_norms(chosen)
        if not self._same_device:
            norms = [t.to(host.device) for t in norms]
        stacked = sharded.globalize(torch.stack(norms).to(host.ledger.dtype), present)
        dest = host.ledger.current[block_start : block_start + n]
        if len(present) == n:
            dest.copy_(stacked)
        else:
            key = tuple(present)
            index = self._missing_index_cache.get(key)
            if index is None:
                index = torch.tensor(present, device=host.device)
                self._missing_index_cache = {key: index}
            dest.index_copy_(0, index, stacked)
        if host.ledger.host_view is not None:
            self._confirm_norm_overflow(block_start, tensors)
            if not sharded:  # a local shard's exact norm is not the global one
                self._confirm_norm_underflow(block_start, tensors)
        return [] if len(present) == n else [i for i in range(n) if tensors[i] is None]

    def _grouped_norms(self, tensors: list[torch.Tensor], dest: torch.Tensor) -> None:
        """L2 norms of float32 CPU ``tensors`` into ``dest``: small tensors of one shape (biases,
        norm-layer weights) as the rows of one stacked tensor, the rest in one _foreach_norm.

        On CPU, _foreach_norm is a loop of one norm per tensor, ~2 us each however small the
        tensor: half of a 500-parameter model's norm cost is its 64-element biases. A row norm
        over the stack reduces each row as the full reduction of that tensor does (same
        values, bit for bit; below the size where a reduction is split across threads).
        One plan per list length (gradients; gradients and weights).
        """
        grouped_norms(self._group_plans_cache, len(tensors), tensors, dest)

    def _skip(self, tensors: list[Optional[torch.Tensor]], indices: list[int]) -> None:
        for i in indices:
            t = tensors[i]
            assert t is not None
            if t.dtype in self._skipped:
                continue
            self._skipped.add(t.dtype)
            name = str(t.dtype).replace("torch.", "")
            warnings.warn(
                f"torch_sentinel: {name} tensors are not watched by the 'norms' probe (e.g. "
                f"{self.host.params[i % len(self.host.params)][0]!r}): torch has no norm for {name} on "
                f"{t.device.type}; their gradient, weight and update norms are not recorded, the others' are",
                RuntimeWarning,
                stacklevel=2,
            )

    def _confirm_norm_overflow(self, start: int, tensors: list[Optional[torch.Tensor]]) -> None:
        """An L2 norm of +inf may be float32 overflow of finite values (|x| > ~1e19): confirm
        exactly, while the tensors are still live, before the row can claim a non-finite value.

        Only where the row is host memory (CPU), so the look is a memory load; the exact check
        runs only when a norm is +inf (cold path). On accelerators in deferred mode the
        detectors treat a +inf norm without NaN as an overflow instead.
        """
        host = self.host
        hv = host.ledger.host_view
        assert hv is not None
        row = hv[start : start + len(tensors)]
        # Every step: C methods only (np.isposinf and np.flatnonzero are Python functions).
        for i in (row == _POS_INF).nonzero()[0].tolist():
            t = tensors[i]
            if t is not None and all_finite(t):
                row[i] = FLOAT_MAX
                name = host.params[i % len(host.params)][0]
                if name not in host.meta.norm_overflow:  # gradient and weight: once each
                    host.meta.norm_overflow.append(name)

    def _confirm_norm_underflow(self, start: int, tensors: list[Optional[torch.Tensor]]) -> None:
        """An L2 norm of exactly 0 may be float32 underflow of nonzero values: squares of
        values below ~1e-23 (a gradient vanished through a deep stack) round to 0, and the
        row would claim the gradient is missing. Where the row is host memory (CPU), finding
        those slots is a memory load; each is taken again scaled by its largest magnitude
        (exact for a truly zero tensor too) and written into its slot: a few device ops, no
        host read. Only for a norm of 0: a missing gradient, a bias before a BatchNorm (its
        gradient cancels), or this underflow. Accelerators keep the 0.
        """
        host = self.host
        hv = host.ledger.host_view
        assert hv is not None
        row = hv[start : start + len(tensors)]
        zeros: list[int] = (row == 0).nonzero()[0].tolist()
        if not zeros:
            return
        # float32 tensors (a vanishing gradient: hundreds of slots, every step): one
        # _foreach_norm accumulating in float64, where the square of any nonzero float32 value
        # (>= 1.4e-45) is a normal number; the norm itself fits float32 (denormals included).
        wide = [i for i in zeros if tensors[i] is not None and tensors[i].dtype is torch.float32]  # type: ignore[union-attr]
        if wide and self._wide_norms(start, tensors, wide):
            done = set(wide)
            zeros = [i for i in zeros if i not in done]
        for i in zeros:
            t = tensors[i]
            if t is None or not reduces(t.dtype, t.device):
                continue  # no tensor, or a skipped dtype: the slot keeps its initial value
            d = t.detach()
            if not (d.dtype.is_complex or d.dtype is torch.float64):
                d = d.float()  # float8/fp16/bf16 values upcast exactly
            with torch.no_grad():
                # Never 0 (so 0/0 cannot happen): an all-zero tensor keeps its norm of 0.
                scale = d.abs().amax().clamp_min(torch.finfo(d.real.dtype).tiny)
                host.ledger.views[start + i].copy_(scale * torch.linalg.vector_norm(d / scale))

    def _wide_norms(self, start: int, tensors: list[Optional[torch.Tensor]], indices: list[int]) -> bool:
        """Float64-accumulated L2 norms of the float32 ``tensors[i]`` into their slots; False
        where this torch's _foreach_norm takes no ``dtype`` (the caller then goes one by one)."""
        host = self.host
        chosen = [tensors[i] for i in indices]
        try:
            with torch.no_grad():
                norms = torch._foreach_norm(chosen, 2, dtype=torch.float64)  # type: ignore[arg-type]
        except (TypeError, RuntimeError):
            return False
        dest = host.ledger.current[start : start + len(tensors)]
        index = torch.tensor(indices, dtype=torch.long, device=dest.device)
        dest.index_copy_(0, index, torch.stack([n.to(dest.device) for n in norms]).to(dest.dtype))
        return True


_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")
_REQUIRES_GRAD = operator.attrgetter("requires_grad")
_FLOAT32 = {torch.float32}
_POS_INF = np.inf


def _grad_norms(record: StepRecord) -> Optional[GradNorms]:
    if not record.has("grad_norm") or not record.meta.backward_calls:
        return None
    at_step = record.array("grad_norm").astype(np.float64)
    meta = record.meta
    return GradNorms(record.keys("grad_norm"), preclip(record, at_step),
                     at_step if meta.clipped else None, meta.grad_missing, meta.frozen)


def _weight_norms(record: StepRecord) -> Optional[WeightNorms]:
    if not record.meta.weights_recorded or not record.has("param_norm"):
        return None
    return WeightNorms(record.keys("param_norm"), record.array("param_norm").astype(np.float64))


def _stale_gradients(record: StepRecord) -> Optional[StaleGradients]:
    if not record.meta.stale_grads:
        return None
    return StaleGradients(record.meta.stale_grads, record.value("misc", "stale_grad_norm"))
