"""``torch-sentinel replay BUNDLE --model module:factory``: re-run a failing step."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from typing import Any, Callable

from .._errors import SentinelError
from ..repro.replay import replay

__all__ = ["load_object", "register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "replay",
        help="re-run the step of an incident bundle in immediate mode, with per-module evidence",
        description="Load log_dir/incidents/step_<N>.pt into a fresh model, re-run that step with "
                    "check='immediate', and print input/output/gradient finiteness and norms for "
                    "every module up to the first offender. Exit code 1 when the replay raised a "
                    "non-finite error, 0 when it ran clean.",
    )
    p.add_argument("bundle", help="path to an incident bundle (.pt)")
    p.add_argument("--model", required=True,
                   help="a callable returning a fresh model: 'package.module:factory' or 'path/to/file.py:factory'")
    p.add_argument("--loss", default=None,
                   help="optional callable loss_fn(output) -> loss, same syntax as --model")
    p.set_defaults(func=run)


def load_object(spec: str) -> Callable[..., Any]:
    """``module:attr`` or ``file.py:attr`` -> the object."""
    where, sep, attr = spec.rpartition(":")
    if not sep or not where or not attr:
        raise ValueError(f"expected 'module:callable' or 'file.py:callable', got {spec!r}")
    if where.endswith(".py") or os.sep in where:
        mod_spec = importlib.util.spec_from_file_location(f"_torch_sentinel_user_{abs(hash(where))}", where)
        if mod_spec is None or mod_spec.loader is None:
            raise ValueError(f"cannot load {where!r}")
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj  # type: ignore[return-value]


def run(args: argparse.Namespace) -> int:
    try:
        model = load_object(args.model)()
        loss_fn = load_object(args.loss) if args.loss else None
        result = replay(args.bundle, model, loss_fn=loss_fn, verbose=True)
    except (OSError, ValueError, AttributeError, ImportError, SentinelError) as exc:
        print(f"torch-sentinel replay: {exc}", file=sys.stderr)
        return 2
    return 1 if result.error is not None else 0
