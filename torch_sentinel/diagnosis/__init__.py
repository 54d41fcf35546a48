"""The diagnosis: findings ordered along the evidence ladder, and the next check."""

from .ladder import HYPOTHESES, NEXT_CHECKS, first_failing_boundary, next_check_for
from .report import Report

__all__ = ["HYPOTHESES", "NEXT_CHECKS", "Report", "first_failing_boundary", "next_check_for"]
