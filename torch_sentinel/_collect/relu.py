"""Per-unit ReLU liveness on the device, for ``nn.ReLU`` modules and functional ReLUs alike.

Every ReLU applied in a training forward is seen through the shared function patches of
``torch.relu``, ``torch.relu_``, ``F.relu``, ``F.relu_``, ``Tensor.relu`` and ``Tensor.relu_``
(``nn.ReLU`` calls ``F.relu``, which calls ``torch.relu``: one call is counted once). The call is
attributed to the innermost attached module whose ``forward`` is on the stack, so a ReLU written
as ``F.relu(self.fc(x))`` inside ``Block.forward`` is reported as ``Block``'s.

Each site keeps a boolean "fired at least once" mask per unit on the device, OR-ed over the
sampled steps of a window (every step up to step 100, then one in ``dead_relu.every``): one
``amax`` and one ``logical_or`` per call, no host read. Units are
features (last dim) for Linear-like outputs and channels (dim 1) for conv outputs.

Under ``torch.compile`` the stack cannot be walked from traced code, so ``nn.ReLU`` modules are
watched through their forward hooks instead: the per-unit "fired" vector is reduced inside the
compiled graph (fused by inductor) and folded into the site's mask outside it, at run time, by
``graph_taps`` (no graph break, nothing to guard on: sampling is decided at run time). Units are
then taken from the last dim, or dim 1 for 4-D and larger outputs, and for 3-D ones when the
model has a ``Conv1d``. Functional ReLUs inside compiled code are not watched (the detector says so).
"""

from __future__ import annotations

import inspect
import re
import sys
import weakref
from collections.abc import Iterable
from typing import Any, ClassVar, Optional

import torch
from torch import nn

from .._record import StepMeta
from .cadence import WIDEN_AT
from .compat import is_compiling as _is_compiling
from .graph_taps import MaskTap, available
from .patches import patch_for
from .probe import Probe, ProbeHost
from .transfer import AsyncFetch

__all__ = ["ReluSite", "ReluWatch"]


#: How far up the stack to look for the module that applied the ReLU: the listener, the patch
#: wrapper, F.relu and its wrapper, nn.ReLU.forward and Module._call_impl fit in eight frames.
_FRAME_DEPTH = 8


#: A ReLU called as a function in a forward's source: F.relu(x), torch.relu_(x), x.relu(),
#: relu(x); ``self.relu(x)`` (``self.block.relu(x)``) is a module's call, watched by its hook.
_FUNCTIONAL = re.compile(r"(?<![\w.])((?:\w+\.)*)relu_?\s*\(")
_ON_RESULT = re.compile(r"[)\]]\s*\.relu_?\s*\(")


def _functional_relu_lines(modules: Iterable[nn.Module]) -> list[str]:
    seen: set[Any] = set()
    found: list[str] = []
    for m in modules:
        forward = getattr(type(m), "forward", None)
        code = getattr(forward, "__code__", None)
        if code is None or code in seen or type(m).__module__.startswith("torch."):
            continue
        seen.add(code)
        try:
            lines, first = inspect.getsourcelines(forward)  # type: ignore[arg-type]
        except (OSError, TypeError):
            continue
        me = code.co_varnames[0] + "." if code.co_argcount else "self."
        for i, line in enumerate(lines):
            text = line.split("#", 1)[0]
            if _ON_RESULT.search(text) or any(not m.group(1).startswith(me) for m in _FUNCTIONAL.finditer(text)):
                found.append(f"{code.co_filename}:{first + i}")
    return found


def _relu_functions() -> list[tuple[Any, str]]:
    F = torch.nn.functional
    return [(torch, "relu"), (torch, "relu_"), (F, "relu"), (F, "relu_"),
            (torch.Tensor, "relu"), (torch.Tensor, "relu_")]


class ReluSite:
    """One (module, unit layout) where ReLUs are applied."""

    __slots__ = ("alive", "module", "steps", "unit_dim", "where")

    def __init__(self, module: str, unit_dim: int, alive: torch.Tensor, where: str = "") -> None:
        self.module = module
        self.unit_dim = unit_dim
        self.alive = alive
        self.steps = 0
        #: The call site, "file.py:line" of the ReLU call inside the module's forward (the
        #: first call seen for this site); "" when unknown.
        self.where = where


class ReluWatch(Probe):
    """Installs the ReLU patches and owns the per-site alive masks."""

    name = "relu"
    #: Set up at attach, or one step's scratch (empty between steps); the sites' masks are the window.
    live_attributes: ClassVar[frozenset[str]] = frozenset(
        {"every", "tap", "_last", "_modules", "_has_conv1d", "_touched", "_conv1d_shapes"})

    def __init__(self, every: int = 1) -> None:
        self.every = max(1, int(every))
        self.sites: dict[tuple[str, int, int], ReluSite] = {}
        self._modules: dict[int, str] = {}
        self.host: Optional[ProbeHost] = None
        self._last: Optional[weakref.ref[torch.Tensor]] = None
        self._touched: set[tuple[str, int, int]] = set()
        self._conv1d_shapes: set[tuple[int, ...]] = set()
        self._has_conv1d = False
        self.tap: Optional[MaskTap] = None

    def setup(self, host: ProbeHost) -> None:
        self.host = host
        self._modules = {id(m): name for name, m in host.map.modules}
        self._has_conv1d = any(isinstance(m, nn.Conv1d) for _, m in host.map.modules)
        for owner, attr in _relu_functions():
            host.hooks.subscribe(patch_for(owner, attr), self)
        self.tap = MaskTap(self._from_graph, host.device)

    def output_modules(self, host: ProbeHost) -> Iterable[nn.Module]:
        return [m for _, m in host.map.modules if isinstance(m, (nn.Conv1d, nn.ReLU))]

    def due(self, step: int) -> bool:
        """Every step up to ``cadence.WIDEN_AT``, then one in ``every``: a site's window counts
        the batches it saw, so sampling changes how soon a dead unit is reported, not whether
        (a unit that fires on one batch in 20 does so on sampled batches alike)."""
        return step < WIDEN_AT or step % self.every == 0

    def close(self) -> None:
        self.host = None
        if self.tap is not None:
            self.tap.close()

    def traced(self) -> bool:
        """Whether this model's hooks were traced by torch.compile."""
        return self.host is not None and self.host.traced

    def unwatched_under_compile(self) -> list[str]:
        """What ``torch.compile`` hides from this watch: ``file:line`` of each functional ReLU
        call in the source of the model's own ``forward`` methods (or every ReLU, without
        ``torch.library.custom_op``). Host-side, from the source: nothing is traced."""
        c = self.host
        if c is None:
            return []
        if not available():  # pragma: no cover - torch < 2.4
            return [n or "<model>" for n, m in c.map.modules if isinstance(m, nn.ReLU)]
        return _functional_relu_lines(m for _, m in c.map.modules)

    # -- patch listener -----------------------------------------------------------------
    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        return None

    def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        c = self.host
        if c is None or not isinstance(result, torch.Tensor):
            return
        if not torch.is_grad_enabled() or _is_compiling() or not self.due(c.step):
            return
        last = self._last() if self._last is not None else None
        if last is result:
            return  # the same call seen again by an outer wrapper (nn.ReLU -> F.relu -> torch.relu)
        self._last = weakref.ref(result)
        if result.ndim < 2 or not result.is_floating_point() or result.numel() == 0:
            return
        caller = self._caller()
        if caller is None:
            return  # applied outside the model (e.g. in the loop): not a unit of the network
        self._reduce(caller[0], result, caller[1])

    def _caller(self) -> Optional[tuple[str, Any]]:
        """(module name, its forward's frame) of the innermost attached module on the stack."""
        frame = sys._getframe(2)
        for _ in range(_FRAME_DEPTH):
            if frame is None:
                return None
            if "self" in frame.f_code.co_varnames[: frame.f_code.co_argcount]:
                name = self._modules.get(id(frame.f_locals.get("self")))
                if name is not None:
                    return name, frame
            frame = frame.f_back  # type: ignore[assignment]
        return None

    def _unit_dim(self, t: torch.Tensor) -> int:
        if t.ndim >= 4 or (t.ndim == 3 and tuple(t.shape) in self._conv1d_shapes):
            return 1
        return t.ndim - 1

    def _reduce(self, module: str, t: torch.Tensor, frame: Any = None) -> None:
        dim = self._unit_dim(t)
        units = int(t.shape[dim])
        key = (module, -1 if dim == t.ndim - 1 else 1, units)
        site = self.sites.get(key)
        if site is None:
            # once per site: the line of the call in the module's forward (nn.ReLU's own
            # forward is torch's, so only a functional call gets a site in user code)
            where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else ""
            site = self.sites[key] = ReluSite(module, key[1], torch.zeros(units, dtype=torch.bool, device=t.device),
                                              where)
        with torch.no_grad():
            d = t.detach()
            # Reductions along contiguous memory run ~4x faster on CPU than amax over a tuple
            # of strided dims: rows of features, or per-channel planes then the batch.
            if dim == d.ndim - 1 and d.is_contiguous():
                peak = d.reshape(-1, units).amax(0)
            elif dim == 1 and d.ndim >= 3 and d.is_contiguous():
                peak = d.flatten(2).amax(2).amax(0)
            else:
                peak = d.amax(dim=tuple(i for i in range(d.ndim) if i != dim))
            torch.logical_or(site.alive, peak > 0, out=site.alive)
        self._touched.add(key)

    def on_output(self, slot: int, module: nn.Module, args: Any, t: torch.Tensor, compiling: bool) -> None:
        if not compiling:
            if t.ndim == 3 and isinstance(module, nn.Conv1d):
                self._conv1d_shapes.add(tuple(t.shape))
            return  # eager ReLUs come through the function patches, with their call site
        if not isinstance(module, nn.ReLU) or self.tap is None:
            return
        if t.ndim < 2 or not t.is_floating_point():
            return
        # Traced: the per-unit reduction becomes part of the graph; the fold runs outside it.
        channels = t.ndim >= 4 or (t.ndim == 3 and self._has_conv1d)
        dim = 1 if channels else t.ndim - 1
        with torch.no_grad():
            d = t.detach()
            peak = d.amax(dim=tuple(i for i in range(d.ndim) if i != dim))
            self.tap.emit(2 * slot + int(channels), peak > 0)

    def _from_graph(self, key: int, fired: torch.Tensor) -> None:
        """Run time, from compiled code: fold one ReLU module's per-unit vector into its site."""
        c = self.host
        if c is None or not self.due(c.step) or fired.numel() == 0:
            return
        slot, channels = divmod(key, 2)
        units = int(fired.shape[0])
        site_key = (c.module_names[slot], 1 if channels else -1, units)
        site = self.sites.get(site_key)
        if site is None:
            alive = torch.zeros(units, dtype=torch.bool, device=fired.device)
            site = self.sites[site_key] = ReluSite(site_key[0], site_key[1], alive)
        torch.logical_or(site.alive, fired, out=site.alive)
        self._touched.add(site_key)

    def on_row_close(self, meta: StepMeta) -> None:
        for key in self._touched:
            self.sites[key].steps += 1
        self._touched.clear()
        self._conv1d_shapes.clear()

    # -- windows ------------------------------------------------------------------------
    def snapshot(self, min_steps: int) -> Optional[tuple[list[ReluSite], list[int], AsyncFetch]]:
        """Start a non-blocking copy of the dead fraction and alive mask of every site that has
        seen ``min_steps`` sampled steps, and reset those sites for the next window."""
        ready = [s for s in self.sites.values() if s.steps >= min_steps]
        if not ready:
            return None
        with torch.no_grad():
            # The per-site dead fraction is computed on the device; only the result travels.
            dead = torch.stack([1.0 - s.alive.float().mean() for s in ready])
            fetch = AsyncFetch([dead, *[s.alive for s in ready]])
        steps = [s.steps for s in ready]
        for s in ready:
            s.alive.zero_()
            s.steps = 0
        return ready, steps, fetch
