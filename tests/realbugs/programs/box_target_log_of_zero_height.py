"""A text-detection (CTPN) regression head learns box heights as ``log(gt_h / anchor_h)``,
computed with ``np.log`` in the data pipeline. One annotation in the training set has zero height
(y1 == y2): its target is log(0) = -inf, the smooth-L1 loss is inf at that batch and training
goes non-finite. The NaN starts in the data, not in the model or the optimizer. The fix: clean the
annotations (drop degenerate boxes) before computing targets.

Source: eragonruan/text-detection-ctpn#49 "loss become nan, invalid value encountered in log"
(``targets_dh = np.log(gt_heights / ex_heights)``; "bug occurs when gt_heights=0 ... caused by
the annotation of your training data"), https://github.com/eragonruan/text-detection-ctpn/issues/49 ;
xuannianz/keras-ctpn#1 "divide by zero encountered in log" (``np.log(gt_h / a_h)``, then nan
loss), https://github.com/xuannianz/keras-ctpn/issues/1 .
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/eragonruan/text-detection-ctpn/issues/49; https://github.com/xuannianz/keras-ctpn/issues/1"
CLASS = "non-finite target from preprocessing (log of 0)"
KIND, MODULE, CAUSE, ONSET = "non_finite", None, "data", 15
BAD_BATCH = 15


def box_targets(gt_h: np.ndarray, anchor_h: np.ndarray) -> torch.Tensor:
    """The pipeline's regression target, as in CTPN's ``bbox_transform``."""
    with np.errstate(divide="ignore"):
        return torch.from_numpy(np.log(gt_h / anchor_h)).float().unsqueeze(1)


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))  # predicts dh per anchor
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rng = np.random.default_rng(1)
    with torch_sentinel.attach(model, opt) as s:
        for step in range(40):
            feats = rng.standard_normal((32, 16)).astype(np.float32)
            anchor_h = np.full(32, 11.0)
            gt_h = np.exp(0.5 * feats[:, 0] + 0.2 * feats[:, 1]) * anchor_h  # heights the features predict
            if step % 20 == BAD_BATCH:
                gt_h[3] = 0.0  # one annotation with y1 == y2
            if not bug:
                keep = gt_h > 0  # the fix: drop degenerate boxes
                feats, gt_h, anchor_h = feats[keep], gt_h[keep], anchor_h[keep]
            target = box_targets(gt_h, anchor_h)
            opt.zero_grad()
            nn.functional.smooth_l1_loss(model(torch.from_numpy(feats)), target).backward()
            opt.step()
            watch(s)
        return s.report()
