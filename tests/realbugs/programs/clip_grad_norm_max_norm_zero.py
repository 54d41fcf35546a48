"""A training config sets ``max_grad_norm: 0`` meaning "no clipping", and the trainer passes it
straight to ``clip_grad_norm_(params, max_norm)``: with max_norm 0 every gradient is multiplied
by 0 between ``backward()`` and ``step()``, so although backward produces non-zero gradients, not
one parameter moves ("0 of 34,701 parameters moved"), and no error is raised. The fix: clip only
when ``max_grad_norm > 0`` (how OpenNMT-py treats 0), or reject 0.

Source: strands-labs/robots#2028 "refuse an on-policy gradient-norm clip the update cannot honor"
(measured: ``max_grad_norm`` 0 -> "0 of 34,701 parameters moved", validate and train succeed),
https://github.com/strands-labs/robots/pull/2028 ; pytorch/torchtitan#4295 ("max_norm=0 remains
supported and deterministically zeros gradients"), https://github.com/pytorch/torchtitan/pull/4295 ;
OpenNMT/OpenNMT-py#1140 "Question about -max_grad_norm 0", https://github.com/OpenNMT/OpenNMT-py/issues/1140 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = ("https://github.com/strands-labs/robots/pull/2028; https://github.com/pytorch/torchtitan/pull/4295; "
          "https://github.com/OpenNMT/OpenNMT-py/issues/1140")
CLASS = "gradients zeroed between backward and step"
KIND, MODULE, CAUSE, ONSET = "no_update", "", None, 0

CONFIG = {"lr": 3e-3, "max_grad_norm": 0.0}  # 0 meant "do not clip"


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    policy = nn.Sequential(nn.Linear(12, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))
    opt = torch.optim.Adam(policy.parameters(), lr=CONFIG["lr"])
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(policy, opt) as s:
        for _ in range(30):
            obs = torch.randn(64, 12, generator=g)
            action = obs[:, :4].tanh()
            opt.zero_grad()
            nn.functional.mse_loss(policy(obs), action).backward()
            if bug or CONFIG["max_grad_norm"] > 0:  # the fix: only clip with a positive bound
                nn.utils.clip_grad_norm_(policy.parameters(), CONFIG["max_grad_norm"])
            opt.step()
            watch(s)
        return s.report()
