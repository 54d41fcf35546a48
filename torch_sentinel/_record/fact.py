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

from typing import ClassVar, Optional, TypeVar

__all__ = ["F", "Fact"]


class Fact:
    """Base class of every fact. Subclasses are frozen dataclasses of plain host values (numbers,
    strings, tuples, numpy arrays): never a live tensor."""

    __slots__ = ()

    #: The probe class that publishes this fact (set from ``Probe.publishes``); None for the
    #: core facts every sentinel collects.
    producer: ClassVar[Optional[type]] = None


F = TypeVar("F", bound=Fact)
