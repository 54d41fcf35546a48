"""Keyword-spotting-style 1-D CNN trained under CPU bfloat16 autocast (no GradScaler, as bf16 needs none).

Modelled on: the torchaudio tutorial "Speech Command Classification"
(https://github.com/pytorch/tutorials/blob/main/intermediate_source/speech_command_classification_with_torchaudio_tutorial.py,
the ``M5`` network: a wide strided first ``Conv1d`` (kernel 80, stride 16), four conv/BN/ReLU/max-pool
blocks, global average pooling, ``log_softmax`` and ``F.nll_loss``; Adam at lr 0.01 with weight
decay 1e-4 and ``StepLR(step_size=20, gamma=0.1)`` per epoch), run under
``torch.autocast("cpu", dtype=torch.bfloat16)`` as the PyTorch AMP recipe shows for CPU
(https://pytorch.org/tutorials/recipes/recipes/amp_recipe.html). The "speech" is 1,000-sample
waveforms: one of five tones with harmonics, random phase and noise.

Why it is healthy: bf16 has float32's range, so nothing overflows and no loss scaling is
needed; activations are rounded to 8 bits of mantissa and the loss is computed in bf16 from
``log_softmax``; it falls to near zero.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

import torch_sentinel

MODELLED_ON = "https://github.com/pytorch/tutorials/blob/main/intermediate_source/speech_command_classification_with_torchaudio_tutorial.py"
CLASSES, SAMPLES, BATCH, STEPS_PER_EPOCH = 5, 1000, 16, 15


class M5(nn.Module):
    def __init__(self, n_input: int = 1, n_output: int = CLASSES, stride: int = 16, n_channel: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(n_input, n_channel, kernel_size=80, stride=stride)
        self.bn1 = nn.BatchNorm1d(n_channel)
        self.pool1 = nn.MaxPool1d(2)
        self.conv2 = nn.Conv1d(n_channel, n_channel, kernel_size=3)
        self.bn2 = nn.BatchNorm1d(n_channel)
        self.pool2 = nn.MaxPool1d(2)
        self.conv3 = nn.Conv1d(n_channel, 2 * n_channel, kernel_size=3)
        self.bn3 = nn.BatchNorm1d(2 * n_channel)
        self.pool3 = nn.MaxPool1d(2)
        self.fc1 = nn.Linear(2 * n_channel, n_output)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(F.relu(self.bn1(self.conv1(x))))
        x = self.pool2(F.relu(self.bn2(self.conv2(x))))
        x = self.pool3(F.relu(self.bn3(self.conv3(x))))
        x = F.avg_pool1d(x, x.shape[-1]).permute(0, 2, 1)
        return F.log_softmax(self.fc1(x), dim=2)


def tones(labels: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    t = torch.arange(SAMPLES) / 8000.0
    freq = (300.0 + 40.0 * labels.float())[:, None]
    phase = 2 * torch.pi * torch.rand(len(labels), 1, generator=g)
    wave = torch.sin(2 * torch.pi * freq * t + phase) + 0.4 * torch.sin(4 * torch.pi * freq * t + phase)
    return (wave + 2.0 * torch.randn(wave.shape, generator=g)).unsqueeze(1)


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = M5()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.0001)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.1)
    sentinel = torch_sentinel.attach(model, optimizer, log_dir=log_dir)
    model.train()
    for step in range(steps):
        target = torch.randint(0, CLASSES, (BATCH,), generator=g)
        data = tones(target, g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = model(data)
            loss = F.nll_loss(output.squeeze(), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % STEPS_PER_EPOCH == STEPS_PER_EPOCH - 1:
            scheduler.step()
        if progress is not None:
            progress.append(loss.item())
    report = sentinel.report()
    sentinel.detach()
    return report
