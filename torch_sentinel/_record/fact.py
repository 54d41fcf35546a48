"""Typed facts: what a probe learned about one step, as a frozen dataclass readers ask for by type.

A probe declares the facts it publishes (``Probe.publishes``) next to its own code; a detector
or a sink declares the facts it reads (``Detector.reads``). At ``attach()`` the sentinel sets up
the probe behind every fact some reader declares, once, so every reader of a fact shares one
producer, and a reader finds its producer (and a type checker its fields) from the type alone.

A fact reaches a step record in one of two ways:

- **published** on the host while the step runs (``host.publish(LossCall(...))``): plain values
  the probe knows without reading the device (which loss function ran, how many classes);
- **decoded** from the step's row of device slots after the row reached the host
  (``host.provide(GradNorms, decode)``): the decoder runs the first time a reader asks for the
  fact on a record, and its result is kept with the record, so a fact nobody reads costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, ClassVar, Optional, TypeVar

if TYPE_CHECKING:
    from .record import StepRecord

__all__ = ["F", "Fact", "FactSources"]


class Fact:
    """Base class of every fact. Subclasses are frozen dataclasses of plain host values (numbers,
    strings, tuples, numpy arrays): never a live tensor."""

    __slots__ = ()

    #: The probe class that publishes this fact (set from ``Probe.publishes``); None for the
    #: core facts every sentinel collects.
    producer: ClassVar[Optional[type]] = None


F = TypeVar("F", bound=Fact)

#: Decodes one fact from a landed record (None when the step has none).
Decoder = Callable[["StepRecord"], Optional[Fact]]


class FactSources:
    """The decoders of one sentinel's device facts, by fact type (shared by all its records)."""

    __slots__ = ("_decoders",)

    def __init__(self) -> None:
        self._decoders: dict[type[Fact], Decoder] = {}

    def provide(self, kind: type[Fact], decoder: Decoder) -> None:
        """Make ``kind`` readable from every record of this sentinel, through ``decoder``."""
        if kind in self._decoders:
            raise KeyError(f"fact {kind.__name__} already has a source")
        self._decoders[kind] = decoder

    def get(self, kind: type[Fact]) -> Optional[Decoder]:
        return self._decoders.get(kind)

    def __contains__(self, kind: type[Fact]) -> bool:
        return kind in self._decoders
