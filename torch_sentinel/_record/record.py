"""A sealed step: the step's host facts with its row of device slots, as plain host numbers.

This is what detectors and sinks receive, once per optimizer step, oldest first. It never holds
a live tensor: the row is a numpy copy that reached the host with one non-blocking transfer.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from .fact import F, Fact
from .layout import SlotRange
from .step import StepMeta

__all__ = ["FactSources", "StepRecord"]

_NOT_READ = object()


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


class StepRecord:
    """One optimizer step as the host sees it.

    ``step`` is the 0-based index of the step (optimizer steps completed before it);
    ``number`` is the same step counted from 1 (what ``optimizer.step()`` calls have been made
    once it completes). ``meta`` holds the host facts every sentinel collects (backward calls,
    learning rates, AMP); :meth:`fact` returns the typed facts of the probes.
    """

    __slots__ = ("_cache", "_loss", "_sources", "blocks", "meta", "values")

    def __init__(self, meta: StepMeta, values: np.ndarray, blocks: dict[str, SlotRange],
                 sources: Optional[FactSources] = None) -> None:
        self.meta = meta
        self.values = values
        self.blocks = blocks
        self._sources = sources
        self._cache: dict[type, object] = {}
        #: The training loss once read (a dozen detectors read it per record).
        self._loss: object = _NOT_READ

    @property
    def step(self) -> int:
        return self.meta.step

    @property
    def number(self) -> int:
        return self.meta.step + 1

    def fact(self, kind: type[F]) -> Optional[F]:
        """The fact of type ``kind`` for this step, or None when the step has none (its probe
        saw nothing this step, or no reader declared it, so it was never collected)."""
        published = self.meta.facts.get(kind)
        if published is not None:
            return published  # type: ignore[return-value]
        got = self._cache.get(kind, _NOT_READ)
        if got is _NOT_READ:
            decode = self._sources.get(kind) if self._sources is not None else None
            got = decode(self) if decode is not None else None
            self._cache[kind] = got
        return got  # type: ignore[return-value]

    def drop_decoded(self) -> None:
        """Forget the facts decoded so far (they are decoded again if asked for): a record kept
        after its window went through the detectors and sinks holds only its row."""
        self._cache.clear()

    # The row's blocks, by name: for the probe that owns a block (its fact decoder) and the
    # non-finite localisation, which walks the ladder over raw slots.
    def has(self, name: str) -> bool:
        return name in self.blocks

    def array(self, name: str) -> np.ndarray:
        b = self.blocks[name]
        return self.values[b.start : b.stop]

    def keys(self, name: str) -> list[str]:
        return self.blocks[name].keys

    def mapping(self, name: str) -> dict[str, float]:
        b = self.blocks[name]
        return dict(zip(b.keys, self.values[b.start : b.stop].tolist()))

    def value(self, name: str, key: str) -> float:
        b = self.blocks[name]
        return float(self.values[b.index(key)])

    @property
    def loss(self) -> Optional[float]:
        """The training loss of this step: the explicit one when given, else the sum of the
        losses that ``backward()`` was called on (so ``(loss / k).backward()`` over k
        micro-batches records the mean)."""
        got = self._loss
        if got is _NOT_READ:
            meta = self.meta
            if meta.loss_explicit:
                got = self.value("loss", "explicit")
            elif meta.backward_calls:
                got = self.value("loss", "auto")
            else:
                got = None
            self._loss = got
        return got  # type: ignore[return-value]

    @property
    def validation(self) -> Optional[float]:
        if self.meta.validation_on_device:
            return self.value("loss", "validation")
        return self.meta.validation
