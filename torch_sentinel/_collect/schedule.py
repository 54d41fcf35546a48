"""The probe table: which probe gets which event, and what happens when a probe fails.

Only the events a probe overrides are scheduled (``probe.overrides``), so an unused event costs
nothing. A probe that raises is a sentinel bug: one warning, and none of its events run again;
the SentinelErrors the user asked for (immediate faults) pass through to the user's call.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Callable

from torch import nn

from .._errors import SentinelError
from .probe import EVENTS, Probe, ProbeHost, overrides

__all__ = ["ProbeTable"]

logger = logging.getLogger("torch_sentinel")


class ProbeTable:
    def __init__(self, modules: Sequence[tuple[str, nn.Module]]) -> None:
        self._slots = {id(m): i for i, (_, m) in enumerate(modules)}
        #: Subscribers of each event but ``on_output``, in registration order.
        self.subs: dict[str, list[Callable[..., None]]] = {e: [] for e in EVENTS if e != "on_output"}
        #: ``on_output`` subscribers per module slot.
        self.out: list[list[Callable[..., None]]] = [[] for _ in modules]
        #: The probes behind ``out``, per slot (what ``watching.ModuleWatch`` asks ``due``).
        self.out_probes: list[list[Probe]] = [[] for _ in modules]
        #: Bumped whenever a subscription changes.
        self.version = 0
        self.probes: list[Probe] = []

    def add(self, probe: Probe, host: ProbeHost) -> None:
        """Set ``probe`` up on ``host`` and schedule its events; a probe is added once."""
        if any(p is probe for p in self.probes):
            return
        probe.setup(host)
        self.probes.append(probe)
        for event, subs in self.subs.items():
            if overrides(probe, event):
                subs.append(getattr(probe, event))
        if overrides(probe, "on_output"):
            for m in probe.output_modules(host):
                slot = self._slots.get(id(m))
                if slot is not None:
                    self.out[slot].append(probe.on_output)
                    self.out_probes[slot].append(probe)
        self.version += 1

    def rebind(self, old: nn.Module, new: nn.Module) -> None:
        """``new`` took ``old``'s place (and slot) in the model: probes added later find it."""
        slot = self._slots.pop(id(old), None)
        if slot is not None:
            self._slots[id(new)] = slot

    def emit(self, subs: list[Callable[..., None]], *args: Any) -> None:
        """Call each subscriber of one event."""
        for fn in subs:
            try:
                fn(*args)
            except SentinelError:
                raise
            except Exception as exc:
                self.switch_off(fn, exc)

    def switch_off(self, fn: Callable[..., None], exc: BaseException) -> None:
        probe = getattr(fn, "__self__", fn)
        logger.warning("torch_sentinel: probe %s failed and is switched off (%s: %s); training goes on",
                       getattr(probe, "name", "") or type(probe).__name__, type(exc).__name__, exc)
        for subs in (*self.subs.values(), *self.out):
            subs[:] = [s for s in subs if getattr(s, "__self__", s) is not probe]
        for probes in self.out_probes:
            probes[:] = [p for p in probes if p is not probe]
        self.version += 1

    def close(self) -> None:
        for probe in self.probes:
            try:
                probe.close()
            except Exception as exc:  # pragma: no cover - defensive
                logger.debug("probe %s close failed: %s", type(probe).__name__, exc)
