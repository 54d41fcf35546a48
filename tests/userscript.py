"""Run a user's training script in a fresh interpreter and read back what it left on disk.

Exit behaviour (atexit, an uncaught exception, ``kill -9``) only shows in a process of its own.
The scripts import the package of this checkout (PYTHONPATH), like the user's would.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
from typing import Any

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: The model, data and loss a README reader has before the snippet: plain torch. From batch
#: SCALE_FROM on, the inputs are 30x larger: the loss jumps, a fault that only the run's last
#: window can show.
PREAMBLE = """\
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
criterion = nn.CrossEntropyLoss()
_g = torch.Generator().manual_seed(1)
loader = [(torch.randn(16, 20, generator=_g) * (30.0 if i >= SCALE_FROM else 1.0),
           torch.randint(0, 4, (16,), generator=_g)) for i in range(STEPS)]
"""


def readme_first_example() -> str:
    """The code block under "Find training faults early" in README.md, verbatim."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("Find training faults early")
    match = re.search(r"```python\n(.*?)```", readme[start:], re.S)
    assert match is not None, "README: no python block after 'Find training faults early'"
    return match.group(1)


def run_script(tmp: pathlib.Path, body: str, *, steps: int = 0, scale_from: int = 10**9, expect_rc: int = 0,
               timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    """Write ``PREAMBLE + body`` to ``tmp/train.py`` and run it with ``cwd=tmp``."""
    script = tmp / "train.py"
    preamble = PREAMBLE.replace("STEPS", str(steps)).replace("SCALE_FROM", str(scale_from))
    script.write_text(preamble + textwrap.dedent(body), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for var in ("TORCH_SENTINEL_ON_NONFINITE", "TORCH_SENTINEL_CHECK"):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == expect_rc, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def events(log_dir: pathlib.Path) -> EventAccumulator:
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def steps_of(acc: EventAccumulator, tag: str) -> list[int]:
    return [e.step for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def value_at(acc: EventAccumulator, tag: str, step: int) -> float:
    return {e.step: e.value for e in acc.Scalars(tag)}[step]


def findings(log_dir: pathlib.Path) -> list[dict[str, Any]]:
    path = log_dir / "findings.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def manifest(log_dir: pathlib.Path) -> dict[str, Any]:
    return dict(json.loads((log_dir / "manifest.json").read_text(encoding="utf-8")))
