"""End to end: a real ``tensorboard`` server serves what the sentinel wrote."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import MLP, make_batch
from torch import nn

import torch_sentinel


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, path: str, **query: str) -> Any:
    url = f"http://127.0.0.1:{port}{path}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def test_tensorboard_serves_scalars_and_findings(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    losses = []
    with torch_sentinel.attach(
        model, opt, log_dir=str(tmp_path / "exp"), on_nonfinite="record", check="deferred"
    ):
        for step in range(6):
            x, y = make_batch("mlp", generator=g)
            if step == 4:
                x[0, 0] = float("nan")
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())

    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(tmp_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--load_fast",
            "false",
            "--reload_interval",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 90
        tags: dict[str, Any] = {}
        while time.monotonic() < deadline:
            if server.poll() is not None:
                pytest.fail(f"tensorboard exited: {server.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            try:
                tags = get(port, "/data/plugin/scalars/tags")
                if "loss/train" in tags.get("exp", {}):
                    break
            except OSError:
                pass  # not listening yet
            time.sleep(0.5)
        else:
            pytest.fail("tensorboard did not serve the run within 90 s")
        assert {
            "loss/train",
            "lr/group0",
            "grad_norm/global",
            "grad_norm/fc1",
            "nonfinite/data",
        } <= set(tags["exp"])
        served = get(port, "/data/plugin/scalars/scalars", run="exp", tag="loss/train")
        assert [row[1] for row in served] == list(range(6))
        # The NaN loss of step 4 is served as NaN, not dropped: hiding it would hide the fault.
        # TensorBoard's JSON encodes it as the string "NaN".
        values = [float(row[2]) for row in served]
        assert values == pytest.approx(losses, rel=1e-6, nan_ok=True)
        assert math.isnan(values[4])
        text_tags = get(port, "/data/plugin/text/tags")["exp"]
        assert "findings/non_finite/text_summary" in text_tags
        entries = get(
            port, "/data/plugin/text/text", run="exp", tag="findings/non_finite/text_summary"
        )
        assert [e["step"] for e in entries] == [4]
        assert "non_finite" in entries[0]["text"] and "next check" in entries[0]["text"]
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
