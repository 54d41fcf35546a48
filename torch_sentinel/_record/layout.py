"""The layout of a step's row: named, contiguous blocks of slots."""

from __future__ import annotations

__all__ = ["SlotRange"]


class SlotRange:
    """A named, contiguous block of slots (e.g. one per parameter)."""

    __slots__ = ("keys", "name", "start", "stop")

    def __init__(self, name: str, start: int, keys: list[str]) -> None:
        self.name = name
        self.start = start
        self.stop = start + len(keys)
        self.keys = keys

    def __len__(self) -> int:
        return self.stop - self.start

    def index(self, key: str) -> int:
        return self.start + self.keys.index(key)
