"""The diagnosis: findings ordered along the evidence ladder, and the next check."""

from .ladder import first_failing_boundary, hypothesis_for, kind_info, next_check_for
from .report import Report

__all__ = ["Report", "first_failing_boundary", "hypothesis_for", "kind_info", "next_check_for"]
