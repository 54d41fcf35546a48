"""What one check vs the Megatron-style path would cost on a GPU: an ESTIMATE, from pieces
measured here (on CPU) and stated assumptions, for when no GPU was lent to the run.

- Megatron-style on a GPU: every parameter copied to the host (``param.data.to("cpu")``, pageable
  memory: assumed :data:`D2H_GBPS`), converted to float32 (bf16 doubles; float32 is as is),
  hashed with SHA-1 at the rate measured here on the host, then a gather of 20-byte digests.
- This check on a GPU: the kernels it launches (counted here with ``count_launches``, which
  counts the ops that would be kernels: one column sum per tensor of ``ROW`` elements or more,
  and a fixed number for all tensors at once) at an assumed :data:`LAUNCH_US` each, plus one read of
  every byte at an assumed :data:`HBM_GBPS` (the column sums; the rest works on ``ROW``-sized
  pieces), plus :data:`COLLECTIVE_US` for its one all-gather and host read.

A small model is launch-bound on a GPU; a large one bandwidth-bound, where the ratio grows with
its size (the Megatron path is linear in the bytes at host speed, the check at device speed).
"""

from __future__ import annotations

from typing import Any

__all__ = ["D2H_GBPS", "HBM_GBPS", "LAUNCH_US", "gpu_estimate"]

#: Assumed: device-to-host copies from pageable memory over PCIe 5 x16 (pinned: about 2x more).
D2H_GBPS = 25.0
#: Assumed: HBM read bandwidth reached by a reduction (H100/H200: ~3.3-4.8 TB/s peak).
HBM_GBPS = 3000.0
#: Assumed: one eager PyTorch op, host dispatch and kernel launch (small kernels are launch-bound).
LAUNCH_US = 6.0
#: Assumed: one small NCCL all-gather within a node plus the host read of its result.
COLLECTIVE_US = 60.0


def _case(nbytes: float, tensors: int, launches: float, sha1_mb_s: float, fp32_bytes: float) -> dict[str, float]:
    megatron_ms = 1e3 * (nbytes / (D2H_GBPS * 1e9) + fp32_bytes / (sha1_mb_s * 1e6))
    check_ms = 1e-3 * (launches * LAUNCH_US + COLLECTIVE_US) + 1e3 * nbytes / (HBM_GBPS * 1e9)
    return {"bytes": nbytes, "tensors": tensors, "megatron_ms": megatron_ms, "check_ms": check_ms,
            "ratio": megatron_ms / check_ms}


def gpu_estimate(one: dict[str, Any]) -> dict[str, Any]:
    """Estimated GPU costs for the benchmark model (as measured here) and for a 7B-parameter
    bf16 model (291 tensors, as Llama-2-7B), from this run's SHA-1 rate and launch count."""
    nbytes = one["megabytes"] * 2**20
    sha1_mb_s = nbytes / 1e6 / (one["median_ms"]["sha1"] / 1e3)
    # One column sum per tensor of ROW elements or more, and a fixed number for all at once.
    fixed = one["launches"] - one["large_tensors"]
    bench = _case(nbytes, one["tensors"], one["launches"], sha1_mb_s, nbytes)
    big_tensors = 291  # every one of them has ROW elements or more
    big = _case(7e9 * 2, big_tensors, big_tensors + fixed, sha1_mb_s, 7e9 * 4)
    return {"sha1_mb_s": sha1_mb_s, "launches_fixed": fixed, "benchmark_model": bench,
            "7b_bf16": big, "assumed": {"d2h_gb_s": D2H_GBPS, "hbm_gb_s": HBM_GBPS,
                                        "launch_us": LAUNCH_US, "collective_us": COLLECTIVE_US}}
