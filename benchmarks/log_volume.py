"""TensorBoard event bytes per step of a 125-module transformer, with the default settings.

```
python -m benchmarks.log_volume            # ~20 s on CPU
```

The figure is marginal: (bytes after ``2n`` steps - bytes after ``n`` steps) / ``n``, so the
one-off events (manifest, hparams, dashboard layout) do not count.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import torch_sentinel

__all__ = ["event_bytes_per_step", "transformer_125"]


class _LM(nn.Module):
    def __init__(self, layers: int, d: int, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 2, 2 * d, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(ids)))


def transformer_125(d: int = 16, vocab: int = 64) -> nn.Module:
    """12 encoder layers of 10 modules each, plus embedding, head, containers: 125 modules."""
    model = _LM(12, d, vocab)
    assert len(list(model.named_modules())) == 125
    return model


def _bytes(log_dir: Path) -> int:
    return sum(f.stat().st_size for f in log_dir.glob("events.out.tfevents.*"))


def _train(log_dir: Path, steps: int, **options: Any) -> int:
    torch.manual_seed(0)
    model = transformer_125()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    with torch_sentinel.attach(model, opt, log_dir=str(log_dir), **options):
        for _ in range(steps):
            ids = torch.randint(0, 64, (4, 8), generator=g)
            opt.zero_grad()
            logits = model(ids)
            F.cross_entropy(logits.reshape(-1, 64), ids.reshape(-1)).backward()
            opt.step()
    return _bytes(log_dir)


def event_bytes_per_step(steps: int = 100, **options: Any) -> float:
    """Marginal event-file bytes per training step of :func:`transformer_125`."""
    with tempfile.TemporaryDirectory() as tmp:
        short = _train(Path(tmp) / "short", steps, **options)
        long = _train(Path(tmp) / "long", 2 * steps, **options)
    return (long - short) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--options", default="{}", help='attach() options as JSON, e.g. \'{"module_log_every": 1}\'')
    args = parser.parse_args()
    options = json.loads(args.options)
    print(f"{event_bytes_per_step(args.steps, **options):.0f} bytes/step ({options or 'defaults'})")


if __name__ == "__main__":
    main()
