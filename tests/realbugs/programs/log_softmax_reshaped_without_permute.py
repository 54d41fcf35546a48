"""A frame-level video summariser outputs scores of shape (batch, classes, frames), takes
``log_softmax`` over the class dimension and then ``reshape(-1, n_class)`` without moving the
class dimension last: each row of the reshaped tensor mixes classes of neighbouring frames, so the
rows fed to ``nll_loss`` are not log-probabilities over the classes and each target is compared
with the wrong frame's scores. torch accepts it silently (the shapes fit). The fix: ``permute(0,
2, 1)`` before the reshape.

Source: weirme/FCSN#32 "A mistake in train.py line 48"
(``log_p = torch.log_softmax(pred_score, dim=1).reshape(-1, n_class)`` where ``pred_score`` is
(n_batch, n_class, n_frame); the right code permutes first), https://github.com/weirme/FCSN/issues/32 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/weirme/FCSN/issues/32"
CLASS = "class dimension scrambled by a reshape without permute"
KIND, MODULE, CAUSE, ONSET = "invalid_loss_input", None, None, 0


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    n_class = 2
    model = nn.Sequential(nn.Conv1d(8, 32, 3, padding=1), nn.ReLU(), nn.Conv1d(32, n_class, 1))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(model, opt) as s:
        for _ in range(40):
            feats = torch.randn(4, 8, 32, generator=g)  # (batch, features, frames)
            keyframe = (feats[:, 0] + feats[:, 1] > 0.5).long()  # (batch, frames)
            pred_score = model(feats)  # (batch, n_class, frames)
            log_p = torch.log_softmax(pred_score, dim=1)
            if bug:
                log_p = log_p.reshape(-1, n_class)  # the bug: classes and frames mixed
            else:
                log_p = log_p.permute(0, 2, 1).reshape(-1, n_class)
            opt.zero_grad()
            nn.functional.nll_loss(log_p, keyframe.reshape(-1)).backward()
            opt.step()
            watch(s)
        return s.report()
