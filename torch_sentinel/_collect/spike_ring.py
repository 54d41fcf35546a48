"""The spike ring: the optimizer's per-parameter figures of the last K steps, kept on the device.

Row ``step % K`` of a preallocated ``[K, 3, P]`` float32 tensor receives, at each optimizer
step, for every watched parameter: the update norm ``||W_after - W_before||``, the weight norm
after the update, and for Adam-family optimizers the sum of ``exp_avg_sq``. Nothing is read on
the host until a spike asks for the ring (:meth:`SpikeRing.read`, cold path).

**One pass over the weights a step.** The weight norm reads every element: a flipped exponent
bit in one element is what it must see. The update norm and the sum of ``exp_avg_sq`` are
measured on a fixed systematic sample of a parameter of more than :data:`WHOLE` = 4,096
elements: ``SAMPLE`` = 2,048 elements, 128 blocks of ``BLOCK`` = 16 consecutive ones (64 bytes
of float32: one cache line), every ``s``-th block from the first, ``s`` the largest odd stride
that still gives 128 blocks (odd, so the blocks walk across the columns of a power-of-two row;
the sample spans 87% or more of a parameter of 16k elements, a prefix of a third to a half of
one below 10k); scaled to the parameter's size at :meth:`SpikeRing.read`. Smaller parameters are
measured whole, exactly. Blocks, not single elements: 2,048 single elements read 2,048 cache
lines (half of a 64k-element weight), the blocks 128; and every sample has one shape, so on CPU
the samples of all large parameters are copied, subtracted and reduced as the rows of one stack
(on the benchmark GPT, in one in-process comparison, 0.45 ms a step less than single-element
samples of varying length, where the harness's own floor is 0.3 ms). An update norm from a
sample needs a copy of the sample only (``P x WHOLE`` floats at most, whatever the model's
size), where an exact one needed a copy of every weight and four more passes over it; the
forensics compare each figure with its own past, and the sample is the same elements every step.

Per step: one ``_foreach_copy_`` at the pre-step, then one ``_foreach_sub_``, one
``_foreach_norm`` over update samples and weights together (stacked straight into the row), one
``_foreach_norm`` of order 1 over the ``exp_avg_sq`` samples and its stack: a fixed count of
launches whatever the number of modules. On CPU, where a ``_foreach`` op is a loop of one
dispatch per tensor, tensors of one shape (biases, the samples, weights up to 4,096 elements)
are copied, subtracted and reduced as the rows of one stack instead (``norm_groups.py``; the
``exp_avg_sq`` rows are summed, which for non-negative values is their L1 norm), and the
post-step's stack of a group of whole weights serves their update and weight norms both; the
figures are the same to the last bit or two.

The samples are views, made again whenever a parameter's storage moved (checked at every
pre-step by its address, and at a post-step without one): a wrapper that swaps a parameter's
storage between steps is measured on the new one.
The lazy-parameter check runs until every parameter is materialised, then never again.

The sum of ``exp_avg_sq`` is kept rather than its minimum: over a weight matrix the minimum
belongs to its least-used element (0 for an embedding's unseen rows; 6x noisier than the sum
step to step on the benchmark GPT's other weights); the sum is the running mean of the squared
gradient norm as the optimizer saw it, so ``||g||^2 / sum(v)`` holds steady (at the clip factor
squared where the loop clips) and grows by up to ``1 / (1 - beta2)`` when a gradient returns into
a second moment that decayed while it was near zero.

The gradient norms are not in the ring: every step's row already carries them to the host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from typing import Optional

import numpy as np
import torch

from .norm_groups import GroupedCopy, GroupPlan, Order, Stacks, grouped_norms, groups_on
from .spike_stats import stacked_norms
from .tensors import materialized, reduces
from .transfer import AsyncFetch

__all__ = ["BLOCK", "RING_STATS", "SAMPLE", "WHOLE", "RingLayout", "SpikeRing", "sample_of", "unit_layout"]

_NUMEL = torch.Tensor.numel  # unbound: half the time of a methodcaller over 500 parameters
_DATA_PTR = torch.Tensor.data_ptr

#: The rows of each ring entry, in order.
RING_STATS = ("update", "weight", "exp_avg_sq")

#: Parameters of more than :data:`WHOLE` elements have their update and ``exp_avg_sq`` measured
#: on a systematic sample of at most this many elements (see the module docstring).
SAMPLE = 2048
#: The sample's blocks: this many consecutive elements, a 64-byte cache line of float32.
BLOCK = 16
#: Parameters up to this many elements are measured whole, exactly. Whole, the weights of a
#: stacked group are stacked once a post-step for their update and weight norms both
#: (``norm_groups.GroupedCopy``), and the sample of so small a tensor would be a third of it or
#: more. The limit is ``norm_groups``' largest stacked row, so the groups of weights and of
#: their samples are the same.
WHOLE = 4096


def sample_of(t: torch.Tensor) -> torch.Tensor:
    """``t``'s sample: ``t`` itself up to :data:`WHOLE` elements or when it is not contiguous (no
    flat view of it), else a ``(SAMPLE // BLOCK, BLOCK)`` view: every ``s``-th block of
    :data:`BLOCK` elements from the first, ``s`` the largest odd stride that still gives that
    many blocks."""
    n = t.numel()
    if n <= WHOLE or not t.is_contiguous():
        return t
    blocks, count = n // BLOCK, SAMPLE // BLOCK
    stride = max((blocks - 1) // (count - 1), 1)
    stride -= 1 - stride % 2  # odd
    return t.view(-1)[: blocks * BLOCK].view(blocks, BLOCK)[::stride][:count]


def _scales(whole: Sequence[torch.Tensor], samples: Sequence[torch.Tensor]) -> np.ndarray:
    """Per tensor, its element count over its sample's: what a sampled sum of squares is
    multiplied by to stand for the whole tensor's."""
    return np.array([w.numel() / max(s.numel(), 1) for w, s in zip(whole, samples)], dtype=np.float64)


@dataclasses.dataclass(frozen=True)
class RingLayout:
    """Which parameter each ring column holds and which unit (module, or module's params in one
    param group) it belongs to; plain host data, for the forensics.

    Attributes:
        params: parameter name of each ring column.
        unit_of: unit index of each column.
        numel: element count of each column.
        units: unit names: modules, ``module[group]`` for a module split across param groups,
            then attention modules and the output module when they own no parameter directly.
        unit_lr: per unit, the learning-rate key of its param group (as ``StepMeta.lr_names``).
        attention: the attention modules' unit names (their logits ride the step's row).
        output: the output module's unit name, or None.
    """

    params: tuple[str, ...]
    unit_of: tuple[int, ...]
    numel: tuple[int, ...]
    units: tuple[str, ...]
    unit_lr: tuple[Optional[str], ...]
    attention: tuple[str, ...] = ()
    output: Optional[str] = None

    def unit_index(self, name: str) -> int:
        return self.units.index(name)


def unit_layout(params: Sequence[str], owners: Sequence[str], groups: Sequence[Optional[str]],
                numel: Sequence[int], attention: Sequence[str] = (), output: Optional[str] = None) -> RingLayout:
    """Group parameters into units: by owning module, split by param group when a module's
    parameters sit in several.

    Args:
        params: parameter names, in ring column order.
        owners: the module that owns each parameter directly.
        groups: the learning-rate key of each parameter's param group (None: no optimizer).
        numel: element count of each parameter.
        attention: attention module names (units of their own when they own no parameter).
        output: the module that makes the output logits, if any.
    """
    split = {o for o in owners if len({g for oo, g in zip(owners, groups) if oo == o}) > 1}
    names: list[str] = []
    index: dict[str, int] = {}
    unit_lr: list[Optional[str]] = []
    unit_of = []
    for owner, group in zip(owners, groups):
        name = f"{owner}[{group}]" if owner in split else owner
        if name not in index:
            index[name] = len(names)
            names.append(name)
            unit_lr.append(group)
        unit_of.append(index[name])
    for extra in (*attention, *([output] if output is not None else [])):
        if extra not in index:
            index[extra] = len(names)
            names.append(extra)
            unit_lr.append(None)
    return RingLayout(tuple(params), tuple(unit_of), tuple(int(n) for n in numel), tuple(names), tuple(unit_lr),
                      tuple(attention), output)


class _Plan:
    """One optimizer's watched parameters, their ring columns and their state tensors."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor], start: int) -> None:
        self.optimizer = optimizer
        self.params = params
        self.cols = slice(start, start + len(params))
        #: A copy of the parameters' samples, taken at the pre-step (on CPU, stacked by shape).
        self.shadow: Optional[list[torch.Tensor]] = None
        self.grouped_shadow: Optional[GroupedCopy] = None
        #: The step whose samples ``shadow`` holds (-1: none): an update is measured only
        #: against the copy taken at the same step's pre-step.
        self.copied = -1
        #: The parameters' element counts when the samples were made.
        self._numels: list[int] = []
        #: The samples (views of the parameters) and the parameters' addresses when they were made.
        self._views: list[torch.Tensor] = []
        self._addresses: list[int] = []
        #: Per column, the factor from a sample's sum of squares (or of ``exp_avg_sq``) to the
        #: whole parameter's.
        self.update_scale = np.ones(len(params))
        self.second_scale = np.ones(len(params))
        #: Whether every parameter is materialised (lazy modules: once true, it stays true).
        self.ready = False
        #: The samples of ``exp_avg_sq`` (views, kept with the state they view).
        self._second: Optional[list[torch.Tensor]] = None
        self._state_key: tuple[int, int] = (-1, -1)
        #: On CPU, where ``_foreach_norm`` is a loop of one dispatch per tensor, small tensors of
        #: one shape are reduced as the rows of one stack (``norm_groups.py``): the plans, by
        #: which list they reduce. Float32 only, as the norms probe does.
        self.grouping = (bool(params) and groups_on(params[0].device)
                         and all(p.dtype is torch.float32 for p in params))
        self._group_plans_cache: dict[Hashable, GroupPlan] = {}

    def norms(self, key: str, tensors: list[torch.Tensor], ord: Order, out: torch.Tensor,
              stacked: Optional[Stacks] = None) -> None:
        """``ord``-norms (or sums) of ``tensors`` into the ring row ``out`` (one value per column);
        ``stacked``: groups of them already stacked (grouping only)."""
        if self.grouping:
            grouped_norms(self._group_plans_cache, key, tensors, out, ord, stacked)
        else:
            stacked_norms(tensors, 1 if ord == "sum" else ord, out=out)

    def copy_samples(self, samples: list[torch.Tensor]) -> None:
        """Copy the samples before the update, into the copy kept from the last step where it
        still fits them; afresh where a parameter was reshaped in place (same size and address:
        :meth:`samples` does not look for that) so that it no longer does."""
        if self.grouping:
            copy = self.grouped_shadow
            if copy is not None and copy.fits(samples):
                try:
                    copy.copy(samples)
                    return
                except RuntimeError:  # members of a group that no longer share a shape
                    pass
            self.grouped_shadow = GroupedCopy(samples, [s is p for s, p in zip(samples, self.params)])
            return
        if self.shadow is not None:
            try:
                torch._foreach_copy_(self.shadow, samples)
                return
            except RuntimeError:
                pass
        self.shadow = [t.detach().clone(memory_format=torch.contiguous_format) for t in samples]

    def materialized(self) -> bool:
        if not self.ready:
            self.ready = all(materialized(p) for p in self.params)
        return self.ready

    def samples(self) -> list[torch.Tensor]:
        """The parameters' samples (views), made again when a parameter's size or storage
        changed (a view keeps its storage alive, so an unchanged address is the same storage).

        Checked every pre-step by element count and address: plain ints. A list of shapes
        would be one new ``torch.Size`` per parameter a step, objects the garbage collector
        counts: on a 500-parameter model they tipped a collection into most steps, and the
        gradients' wrappers alive then were carried into the oldest generation, whose full
        collections (200 ms on that model) then came every ~300 steps.
        """
        numels = list(map(_NUMEL, self.params))
        addresses = list(map(_DATA_PTR, self.params))
        if numels == self._numels and addresses == self._addresses:
            return self._views
        self._numels, self._addresses = numels, addresses
        views = list(map(sample_of, self.params))
        if [v.shape for v in views] != [v.shape for v in self._views]:
            self.shadow = self.grouped_shadow = None  # the copy no longer fits the samples
            self.update_scale = _scales(self.params, views)
        self._views = views
        return views

    @property
    def views(self) -> list[torch.Tensor]:
        """The samples as :meth:`samples` last made them."""
        return self._views

    def second_moments(self) -> Optional[list[torch.Tensor]]:
        """The samples of ``exp_avg_sq`` per parameter, or None for optimizers without it. The
        list is kept across steps; a new state (load_state_dict, a parameter's first step)
        rebuilds it."""
        state = self.optimizer.state
        first = state.get(self.params[0]) if self.params else None
        key = (len(state), id(first.get("exp_avg_sq")) if first else 0)
        if key != self._state_key:
            self._state_key = key
            entries = [state.get(p) or {} for p in self.params]
            if not any("exp_avg_sq" in e for e in entries):
                self._second = None
            else:
                empty = self.params[0].new_zeros(())
                second = [e.get("exp_avg_sq", empty) for e in entries]
                self._second = list(map(sample_of, second))
                self.second_scale = _scales(second, self._second)
        return self._second


class SpikeRing:
    """The device ring (see the module docstring). Host bookkeeping: which step each row holds."""

    def __init__(self, device: torch.device, optimizers: Sequence[torch.optim.Optimizer],
                 watched: Sequence[torch.Tensor], steps: int = 32) -> None:
        self.steps = steps
        self.device = device
        watched_ids = {id(p) for p in watched}
        self.plans: dict[int, _Plan] = {}
        self.columns: list[torch.Tensor] = []
        seen: set[int] = set()
        for opt in optimizers:
            params = [p for g in opt.param_groups for p in g["params"]
                      if id(p) in watched_ids and id(p) not in seen and reduces(p.dtype, p.device)]
            seen.update(id(p) for p in params)
            self.plans[id(opt)] = _Plan(opt, params, len(self.columns))
            self.columns.extend(params)
        self.ring = torch.full((steps, len(RING_STATS), len(self.columns)), float("nan"), device=device)
        #: Per optimizer and ring row, the views its post-step writes: the row's first two stats
        #: together (update and weight norms), then each stat. Made once (the ring is never
        #: reallocated): indexing the ring every step was five view ops, each a dispatch.
        self._rows = {key: [(block[0:2], *block.unbind(0)) for block in self.ring[:, :, plan.cols].unbind(0)]
                      for key, plan in self.plans.items()}
        #: The step each row holds (-1: none yet), per optimizer: an optimizer that did not step
        #: leaves its columns of that row as they were.
        self.row_steps = {key: np.full(steps, -1, dtype=np.int64) for key in self.plans}

    def before_update(self, optimizer: torch.optim.Optimizer, step: int) -> None:
        plan = self.plans.get(id(optimizer))
        if plan is None or not plan.params or not plan.materialized():
            return
        with torch.no_grad():
            plan.copy_samples(plan.samples())
        plan.copied = step

    def after_update(self, optimizer: torch.optim.Optimizer, step: int) -> None:
        plan = self.plans.get(id(optimizer))
        if plan is None or not plan.params or not plan.materialized():
            return
        first_two, update, weight, second_sum = self._rows[id(optimizer)][step % self.steps]
        weights = plan.params
        have_update = (plan.shadow is not None or plan.grouped_shadow is not None) and plan.copied == step
        # The pre-step made the views (checking every parameter's size and address); a storage
        # swapped inside the optimizer's own step is seen at the next pre-step.
        samples = plan.views if plan.copied == step else plan.samples()
        with torch.no_grad():
            if have_update and plan.grouped_shadow is not None:
                # ||W_before - W_after|| on the sample; the weights measured whole come back stacked
                stacked = plan.grouped_shadow.changed(samples, update)
                plan.norms("weight", weights, 2, weight, stacked)
            elif have_update:
                assert plan.shadow is not None
                torch._foreach_sub_(plan.shadow, samples)  # W_before - W_after on the sample
                # One _foreach_norm for both: a launch saved on an accelerator.
                stacked_norms(plan.shadow + weights, 2, out=first_two)
            else:
                update.fill_(float("nan"))  # no copy of this step's weights: no update norm
                plan.norms("weight", weights, 2, weight)
            second = plan.second_moments()
            if second is not None:
                plan.norms("second", second, "sum", second_sum)  # exp_avg_sq is non-negative
        self.row_steps[id(optimizer)][step % self.steps] = step

    def read(self) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """The ring on the host, its samples scaled to whole parameters, and the step each row
        holds per optimizer (cold path: one copy of ``K x 3 x P`` floats, waited for)."""
        fetch = AsyncFetch([self.ring])
        fetched = fetch.result(block=True)
        assert fetched is not None
        values = fetched[0].astype(np.float64)
        for plan in self.plans.values():
            values[:, 0, plan.cols] *= np.sqrt(plan.update_scale)
            values[:, 2, plan.cols] *= plan.second_scale
        return values, {k: v.copy() for k, v in self.row_steps.items()}

    def weights_moved(self, step: int, factor: float = 2.0) -> list[tuple[int, float, float]]:
        """``(column, norm after step - 1's update, norm now)`` of each weight whose norm changed
        by ``factor`` or more (or became non-finite) since the optimizer last stepped it at step
        ``step - 1``: a value something other than the optimizer wrote before step ``step``'s
        own update. Only while that holds for the weights now: an optimizer that stepped since
        (a fault described later, in deferred mode) leaves nothing to compare. Cold path (a
        fault is being described): one blocking copy."""
        before: list[torch.Tensor] = []
        now: list[torch.Tensor] = []
        columns: list[int] = []
        row = (step - 1) % self.steps
        for key, plan in self.plans.items():
            # The latest row held is step - 1's (row ``row``): no optimizer step since.
            if not plan.params or not plan.ready or self.row_steps[key].max() != step - 1:
                continue
            with torch.no_grad():
                before.append(self.ring[row, 1, plan.cols])
                now.append(stacked_norms(plan.params, 2))
            columns.extend(range(plan.cols.start, plan.cols.stop))
        if not before:
            return []
        fetched = AsyncFetch([torch.cat(before), torch.cat(now)]).result(block=True)
        assert fetched is not None
        then, current = (v.astype(np.float64) for v in fetched)
        moved = []
        for col, a, b in zip(columns, then, current):
            if not np.isfinite(a) or a <= 0:
                continue
            if not np.isfinite(b) or b >= factor * a or b * factor <= a:
                moved.append((col, float(a), float(b)))
        return moved

    def close(self) -> None:
        for plan in self.plans.values():
            plan.shadow = plan.grouped_shadow = None
