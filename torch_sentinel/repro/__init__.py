"""The experimental layer: seeds, the run manifest, determinism checks, incident bundles and
their replay, and the diff of two runs."""

from __future__ import annotations

from .determinism import DeterminismReport, check_determinism
from .diff import ManifestDiff, diff_manifests
from .manifest import build_manifest, load_manifest
from .replay import ReplayResult, replay
from .seed import ReproducibilityWarning, Seeds, seed_everything

__all__ = [
    "DeterminismReport",
    "ManifestDiff",
    "ReplayResult",
    "ReproducibilityWarning",
    "Seeds",
    "build_manifest",
    "check_determinism",
    "diff_manifests",
    "load_manifest",
    "replay",
    "seed_everything",
]
