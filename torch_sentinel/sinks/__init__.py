"""Sinks: where records and findings go (TensorBoard, console logging, JSONL). One per file."""

from __future__ import annotations

from .base import Sink, SinkContext
from .build import build_sinks

__all__ = ["Sink", "SinkContext", "build_sinks"]
