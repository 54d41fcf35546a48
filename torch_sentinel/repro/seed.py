"""Seeding every random source at once, and handing out independent streams.

    seeds = torch_sentinel.seed_everything(42)
    data_rng = seeds.numpy("data")            # numpy Generator, its own stream
    aug_gen = seeds.torch("augmentation")     # torch.Generator, its own stream
    loader = DataLoader(ds, num_workers=4, **seeds.dataloader_kwargs())

Named streams come from ``numpy.random.SeedSequence`` children keyed by the name, so adding a
stream, or drawing more numbers from one, does not shift the others (the seeds' "separate
random streams when independence helps").
"""

from __future__ import annotations

import os
import random
import warnings
import zlib
from collections.abc import Iterable
from typing import Any, Optional

import numpy as np
import torch

__all__ = ["ReproducibilityWarning", "Seeds", "determinism_flags", "last_seed", "seed_everything"]


class ReproducibilityWarning(UserWarning):
    """A known source of run-to-run differences that seeding does not remove."""


_LAST_SEED: Optional[int] = None


def last_seed() -> Optional[int]:
    """The seed of the latest :func:`seed_everything` call in this process, if any."""
    return _LAST_SEED


def _key(name: str) -> int:
    return zlib.crc32(name.encode("utf-8"))


class Seeds:
    """The root seed and the streams derived from it."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.root = np.random.SeedSequence(seed)

    def spawn(self, n: int) -> list[np.random.SeedSequence]:
        """``n`` fresh independent children of the root (``SeedSequence.spawn``): each call
        returns new ones, in order."""
        return self.root.spawn(n)

    def sequence(self, name: str) -> np.random.SeedSequence:
        """The child sequence for a named stream: the same name gives the same stream."""
        return np.random.SeedSequence(self.seed, spawn_key=(_key(name),))

    def numpy(self, name: str) -> np.random.Generator:
        return np.random.default_rng(self.sequence(name))

    def torch(self, name: str, device: Any = "cpu") -> torch.Generator:
        g = torch.Generator(device=device)
        g.manual_seed(int(self.sequence(name).generate_state(1, np.uint64)[0] >> np.uint64(1)))
        return g

    def worker_init_fn(self, worker_id: int) -> None:
        """Seeds ``random`` and ``numpy`` in a DataLoader worker from torch's per-worker seed
        (which the loader's generator makes reproducible)."""
        worker_seed = torch.initial_seed() % 2**32
        random.seed(worker_seed)
        np.random.seed(worker_seed)

    def dataloader_kwargs(self, name: str = "data") -> dict[str, Any]:
        """``generator`` and ``worker_init_fn`` for a DataLoader: shuffling and workers'
        randomness then follow the seed."""
        return {"generator": self.torch(name), "worker_init_fn": self.worker_init_fn}

    def __int__(self) -> int:
        return self.seed

    def __repr__(self) -> str:
        return f"Seeds({self.seed})"


def determinism_flags() -> dict[str, Any]:
    """The switches that decide whether the same seed gives the same numbers."""
    cudnn = torch.backends.cudnn
    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_deterministic": bool(cudnn.deterministic),
        "cudnn_benchmark": bool(cudnn.benchmark),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "pythonhashseed": os.environ.get("PYTHONHASHSEED"),
    }


def loader_warnings(loaders: Iterable[Any]) -> list[str]:
    """What makes these DataLoaders' order or workers' randomness escape the seed."""
    out = []
    for i, loader in enumerate(loaders):
        workers = int(getattr(loader, "num_workers", 0) or 0)
        if workers > 0 and getattr(loader, "worker_init_fn", None) is None:
            out.append(
                f"DataLoader {i} has num_workers={workers} and no worker_init_fn: random and numpy "
                "in the workers do not follow the seed; pass **seeds.dataloader_kwargs()"
            )
        if getattr(loader, "generator", None) is None and _shuffles(loader):
            out.append(
                f"DataLoader {i} shuffles without a generator: its order depends on every earlier "
                "draw from torch's global RNG; pass generator=seeds.torch('data')"
            )
    return out


def _shuffles(loader: Any) -> bool:
    sampler = getattr(loader, "sampler", None)
    return type(sampler).__name__ == "RandomSampler" and getattr(sampler, "generator", None) is None


def seed_everything(
    seed: int,
    *,
    deterministic: bool = False,
    loaders: Iterable[Any] = (),
    warn: bool = True,
) -> Seeds:
    """Seed ``random``, ``numpy`` and ``torch`` (every device) with ``seed``; return the
    :class:`Seeds` that hands out independent named streams.

    ``deterministic=True`` also switches on ``torch.use_deterministic_algorithms`` and
    cuDNN's deterministic mode (and sets ``CUBLAS_WORKSPACE_CONFIG`` if unset). Otherwise, and
    for ``loaders`` (DataLoaders) whose workers or order escape the seed, a
    :class:`ReproducibilityWarning` names each known source of non-determinism.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed_everything() expected an int seed, got {type(seed).__name__}")
    seed = int(seed)
    if not 0 <= seed < 2**63:
        raise ValueError(f"seed must be in [0, 2**63), got {seed}")
    global _LAST_SEED
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # seeds the CPU and every accelerator generator
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    _LAST_SEED = seed
    if warn:
        problems = []
        if not torch.are_deterministic_algorithms_enabled():
            problems.append(
                "torch.use_deterministic_algorithms is off: some kernels (scatter_add, index_add, "
                "cuDNN convolutions backward...) may differ run to run; "
                "pass deterministic=True to switch it on"
            )
        if torch.backends.cudnn.benchmark:
            problems.append(
                "torch.backends.cudnn.benchmark is on: cuDNN picks its algorithms by timing, "
                "which can change between runs"
            )
        problems.extend(loader_warnings(loaders))
        for text in problems:
            warnings.warn(text, ReproducibilityWarning, stacklevel=2)
    return Seeds(seed)
