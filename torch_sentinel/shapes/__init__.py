"""The structural layer: shape contracts, notes on shape errors, and the meta-device dry run."""

from __future__ import annotations

from .contracts import explain_broadcast, rank_hint
from .dry_run import ShapeTable, check_shapes
from .expect import ContractHandle, expect

__all__ = ["ContractHandle", "ShapeTable", "check_shapes", "expect", "explain_broadcast", "rank_hint"]
