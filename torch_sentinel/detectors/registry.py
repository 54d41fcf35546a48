"""The detectors that ship, in ladder order. Add a detector here to switch it on by default."""

from __future__ import annotations

from .base import Detector

DETECTORS: list[type[Detector]] = []
