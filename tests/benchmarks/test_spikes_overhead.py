"""The loss_spike overhead benchmark (``benchmarks/spikes/overhead.py``) charges the patch of
``F.scaled_dot_product_attention`` to the variant that has ``loss_spike`` only: the two baselines
call the function from before any attach (regression: they went through the patch and its
listener, which understated loss_spike's cost)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.spikes import overhead  # noqa: E402
from torch_sentinel._collect import attention_logits  # noqa: E402


def test_only_the_loss_spike_variant_goes_through_the_sdpa_patch(monkeypatch) -> None:
    seen: list[Optional[int]] = []
    on_sdpa = attention_logits.AttentionLogits.on_sdpa

    def spy(self: attention_logits.AttentionLogits, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        seen.append(self.current)
        on_sdpa(self, args, kwargs)

    monkeypatch.setattr(attention_logits.AttentionLogits, "on_sdpa", spy)
    unpatched = F.scaled_dot_product_attention
    result = overhead.measure(steps=2, warmup=1, model_name="gpt", clock="cpu")
    layers = overhead.Config().layers
    assert seen == list(range(layers)) * 3  # three steps of the one variant, each layer from its own module
    assert F.scaled_dot_product_attention is unpatched  # detached: the function is back
    assert set(result["median_step_ms"]) == set(overhead.VARIANTS)  # type: ignore[arg-type]
