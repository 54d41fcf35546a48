"""The replica check's cost: one check against the Megatron-style path, and the default cadence's
share of a DDP training step.

    python -m benchmarks.replicas                  # CPU, 2 gloo ranks, about 2 minutes
    python -m benchmarks.replicas --device cuda    # NCCL, one rank per GPU

See ``run.py`` for the method. Writes ``benchmarks/results/replicas-<device>.{json,md}``.
"""

from .run import main

__all__ = ["main"]
