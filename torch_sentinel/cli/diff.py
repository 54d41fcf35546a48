"""``torch-sentinel diff RUN_A RUN_B``: what differs between two runs' manifests."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..repro.diff import diff_manifests
from ..repro.manifest import load_manifest

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "diff",
        help="compare two runs' manifests: seed, hyperparameters, versions, final loss",
        description="Print what differs between two runs' manifest.json (seed, lr, versions, "
                    "code, ...), warn when more than one factor changed, and compare final losses.",
    )
    p.add_argument("run_a", help="log_dir (or manifest.json) of the first run")
    p.add_argument("run_b", help="log_dir (or manifest.json) of the second run")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        a, b = load_manifest(args.run_a), load_manifest(args.run_b)
    except (OSError, ValueError) as exc:
        print(f"torch-sentinel diff: {exc}", file=sys.stderr)
        return 2
    print(diff_manifests(a, b, names=(args.run_a, args.run_b)))
    return 0
