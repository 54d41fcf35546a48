"""A DDPM on 2-D points with a DiT-style denoiser whose output layer and adaLN modulations start at exactly zero.

Modelled on: tanelp/tiny-diffusion ``ddpm.py`` (https://github.com/tanelp/tiny-diffusion/blob/master/ddpm.py:
a linear-beta ``NoiseScheduler`` with 50 timesteps, sinusoidal time embeddings, an MLP denoiser,
``loss = F.mse_loss(noise_pred, noise)`` at a uniformly drawn timestep, AdamW at lr 1e-3,
``clip_grad_norm_(1.0)``) with the block design and initialisation of facebookresearch/DiT
``models.py`` (https://github.com/facebookresearch/DiT/blob/main/models.py: adaLN-Zero blocks
whose ``adaLN_modulation`` Linear is zero-initialised so each block starts as the identity,
and ``nn.init.constant_(final_layer.linear.weight, 0)``, bias 0, time-embedding MLP weights
N(0, 0.02)). Data: points on a circle of radius 1 and a smaller one of radius 0.4.

Why it is healthy: at step 0 the output layer is exactly zero, so only its own weight gets a
gradient; every gate and modulation starts from 0 and Adam's first updates are infinitely large
relative to them. That is adaLN-Zero by design. The per-batch loss depends on the timesteps
drawn (the noise added at small t is almost invisible in the sample, so it cannot be predicted
and costs ~1 whatever the model does), so it is noisy and has a high floor: it falls from ~0.9
to ~0.7 within ~50 steps and then fluctuates around that level.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

import torch_sentinel

MODELLED_ON = "https://github.com/facebookresearch/DiT/blob/main/models.py"
T_STEPS, HIDDEN, DEPTH, BATCH = 50, 64, 3, 64


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden: int, freq: int = 32) -> None:
        super().__init__()
        self.freq = freq
        self.mlp = nn.Sequential(nn.Linear(freq, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.freq // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half) / half)
        args = t[:, None].float() * freqs[None]
        return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1))


class DiTBlock(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.GELU(approximate="tanh"), nn.Linear(2 * hidden, hidden))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 3 * hidden))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale, gate = self.adaLN_modulation(c).chunk(3, dim=1)
        return x + gate * self.mlp(modulate(self.norm(x), shift, scale))


class FinalLayer(nn.Module):
    def __init__(self, hidden: int, out: int) -> None:
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden, out)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class Denoiser(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.x_embedder = nn.Linear(2, HIDDEN)
        self.t_embedder = TimestepEmbedder(HIDDEN)
        self.blocks = nn.ModuleList([DiTBlock(HIDDEN) for _ in range(DEPTH)])
        self.final_layer = FinalLayer(HIDDEN, 2)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.constant_(m.bias, 0)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        for block in self.blocks:
            nn.init.constant_(block.adaLN_modulation[-1].weight, 0)
            nn.init.constant_(block.adaLN_modulation[-1].bias, 0)
        nn.init.constant_(self.final_layer.adaLN_modulation[-1].weight, 0)
        nn.init.constant_(self.final_layer.adaLN_modulation[-1].bias, 0)
        nn.init.constant_(self.final_layer.linear.weight, 0)
        nn.init.constant_(self.final_layer.linear.bias, 0)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        c = self.t_embedder(t)
        h = self.x_embedder(x)
        for block in self.blocks:
            h = block(h, c)
        return self.final_layer(h, c)


def circles(n: int, g: torch.Generator) -> torch.Tensor:
    angle = torch.rand(n, generator=g) * 2 * math.pi
    radius = torch.where(torch.rand(n, generator=g) < 0.5, 1.0, 0.4)
    return torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], 1) + 0.02 * torch.randn(n, 2, generator=g)


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    betas = torch.linspace(1e-4, 0.02, T_STEPS)
    alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)
    model = Denoiser()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sentinel = torch_sentinel.attach(model, optimizer, log_dir=log_dir)
    model.train()
    for _ in range(steps):
        batch = circles(BATCH, g)
        noise = torch.randn(batch.shape, generator=g)
        timesteps = torch.randint(0, T_STEPS, (BATCH,), generator=g)
        a = alphas_cumprod[timesteps][:, None]
        noisy = a.sqrt() * batch + (1 - a).sqrt() * noise  # NoiseScheduler.add_noise
        noise_pred = model(noisy, timesteps)
        loss = F.mse_loss(noise_pred, noise)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if progress is not None:
            progress.append(loss.item())
    report = sentinel.report()
    sentinel.detach()
    return report
