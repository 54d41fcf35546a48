"""Detectors: host code that turns step records into findings. One detector per file.

Every module of this package whose name does not start with an underscore may define detector
classes; the sentinel finds them here (:func:`builtin_detectors`), so adding a detector is adding
its file. Users pass their own instances to ``attach(..., detectors=[...])``.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Sequence

from .._collect.probe import ProbeHost
from .._findings import BOUNDARIES
from .base import Detector, RunContext, Threshold

__all__ = ["Detector", "RunContext", "Threshold", "builtin_detectors", "default_detectors", "install_probes"]

#: Modules of this package that hold no detector.
_NOT_DETECTORS = frozenset({"base", "state"})


@functools.cache
def builtin_detectors() -> tuple[type[Detector], ...]:
    """Every detector class that ships, in ladder order (rung, then kind)."""
    found: list[type[Detector]] = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name in _NOT_DETECTORS:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        found.extend(
            obj for obj in vars(module).values()
            if isinstance(obj, type) and issubclass(obj, Detector) and obj.kind
            and obj.__module__ == module.__name__
        )
    return tuple(sorted(found, key=lambda cls: (BOUNDARIES.index(cls.rung), cls.kind)))


def default_detectors(disable: frozenset[str] = frozenset()) -> list[Detector]:
    """A fresh instance of every built-in detector, minus the kinds ``attach(disable=...)`` names."""
    return [cls() for cls in builtin_detectors() if cls.kind not in disable]


def install_probes(host: ProbeHost, readers: Sequence[Detector]) -> None:
    """Set up what ``readers`` need on ``host``: the probes each detector owns, then, for every
    fact a detector reads, the probe that publishes it, once (shared by all its readers; a
    probe of that class already set up, a core one or one a detector owns, serves)."""
    for reader in readers:
        for probe in reader.probes():
            host.add_probe(probe)
    for reader in readers:
        for fact in reader.reads:
            producer = fact.producer
            if producer is not None and not host.has_probe(producer):
                host.add_probe(producer())
