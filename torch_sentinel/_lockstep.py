"""The lockstep point: where every rank may run a collective, because every rank gets there
the same number of times.

Under ``torch.distributed`` the sentinel's collectives (the non-finite agreement of
``_distributed.RankSync``, the replica check of ``_replicas/``) must pair up across ranks. The
point they use is each **training forward** (grad enabled, not traced by ``torch.compile``) of the
model as passed to ``attach()``: DDP and FSDP require every rank to run the same training
forwards, or they hang themselves, whatever each rank's loop does with ``optimizer.step()``. The
hook is a forward pre-hook registered first, so it runs before DDP's or FSDP's own work in that
forward: an error raised there leaves no rank inside a collective. Evaluation forwards under
``torch.no_grad()`` or ``torch.inference_mode()`` are not counted, on any rank.

A loop that never calls the attached model's forward (a Lightning ``training_step`` that calls
submodules directly) has no such point. When the first row closes before any training forward,
the points are the row closes instead (the end of each optimizer step), for the whole run: every
rank must then step alike. The mode is decided by the first step, which every rank runs alike.

``report()`` is a collective under ``torch.distributed`` (it gathers every rank's findings), so it
is a lockstep point too: followers run their last agreement there. ``detach()`` is not (a rank
may detach from an exception handler while the others train on).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn

from ._collect.compat import is_compiling
from ._collect.hookset import ModuleHook
from ._collect.probe import Probe, ProbeHost
from ._errors import raised_at_entry

__all__ = ["Follower", "Lockstep"]


class Follower:
    """What runs at the lockstep points, in the order followers were added. Each method is a
    collective when it runs one: every rank calls it at the same point."""

    def at_point(self) -> None:
        """A lockstep point: a training forward (or, in row mode, a row close)."""

    def at_forward(self) -> None:
        """A training forward, after every follower's :meth:`at_point`."""

    def at_report(self) -> None:
        """``report()`` on every rank (``all_ranks``)."""


class Lockstep(Probe):
    """Calls its followers at the lockstep points of one sentinel.

    Args:
        model: the module passed to ``attach()`` (its forward pre-hook is the point).
    """

    name = "lockstep point"

    def __init__(self, model: nn.Module) -> None:
        #: Held until setup hooks it (then the model's hook holds this object, not the reverse).
        self._model: Optional[nn.Module] = model
        self._followers: list[Follower] = []
        #: "forward" or "row", decided by the first training forward or row close.
        self.mode: Optional[str] = None
        self.forwards = 0

    @classmethod
    def maybe(cls, model: nn.Module, host: Any) -> Optional[Lockstep]:
        """A Lockstep added to ``host`` (the collector) under a process group of more than one
        rank, else None."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        lockstep = cls(model)
        host.add_probe(lockstep)
        return lockstep

    def follow(self, follower: Follower) -> None:
        self._followers.append(follower)

    def setup(self, host: ProbeHost) -> None:
        model, self._model = self._model, None
        assert model is not None, "a Lockstep is set up once"
        # First of the forward pre-hooks: before DDP's or FSDP's own work in that forward.
        # A SentinelError (the agreed fault, a replica divergence) leaves with the user's frames only.
        hook = ModuleHook(raised_at_entry, self._before_forward)
        host.hooks.add(model.register_forward_pre_hook(hook, prepend=True))

    def _before_forward(self, module: nn.Module, args: Any) -> None:
        if not torch.is_grad_enabled() or is_compiling():
            return None
        self.forwards += 1
        if self.mode is None:
            self.mode = "forward"
        if self.mode == "forward":
            for f in self._followers:
                f.at_point()
        for f in self._followers:
            f.at_forward()
        return None

    def on_row_closed(self, step: int) -> None:
        if self.mode is None:
            self.mode = "row"  # no training forward of the attached model before the first row
        if self.mode == "row":
            for f in self._followers:
                f.at_point()

    def at_report(self) -> None:
        """``report(all_ranks=True)``: the last point of every follower (a collective)."""
        for f in self._followers:
            f.at_report()

    def close(self) -> None:
        self._followers = []
