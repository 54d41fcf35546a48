"""An unsupervised RL agent (CIC, built on a DrQ-style DDPG) encodes its pixel observations
inside ``with torch.no_grad():`` before the critic update, yet keeps an encoder optimizer that
steps after every critic backward: no gradient ever reaches the encoder, its optimizer steps every
iteration on nothing, and the CNN never learns. The base agent's fix: encode ``obs`` with
gradients and only ``next_obs`` under ``no_grad``.

Source: rll-research/cic#5 "No gradient through the cnn encoder" ("the observations are encoded
inside torch.no_grad which means that there is no gradient calculation for the CNN, which means
that the CNN weights will not be updated"), https://github.com/rll-research/cic/issues/5 ; the
agent's ``update_critic`` steps ``encoder_opt`` after ``critic_loss.backward()``
(https://github.com/rll-research/cic/blob/main/agent/ddpg.py).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/rll-research/cic/issues/5"
CLASS = "a network's forward under no_grad while its own optimizer steps"
KIND, MODULE, CAUSE, ONSET = "no_gradient", "encoder", None, 0


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.convnet = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=1), nn.ReLU())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.convnet(obs - 0.5).flatten(1)


class Critic(nn.Module):
    def __init__(self, repr_dim: int, action_dim: int) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(repr_dim, 32), nn.LayerNorm(32), nn.Tanh())
        self.q = nn.Sequential(nn.Linear(32 + action_dim, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, h: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.q(torch.cat([self.trunk(h), action], -1))


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    encoder, critic = Encoder(), Critic(8 * 4 * 4, 2)
    encoder_opt = torch.optim.Adam(encoder.parameters(), lr=1e-3)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
    agent = nn.ModuleDict({"encoder": encoder, "critic": critic})
    g = torch.Generator().manual_seed(1)
    with torch_sentinel.attach(agent, [encoder_opt, critic_opt]) as s:
        for _ in range(40):
            obs = torch.rand(32, 3, 13, 13, generator=g)
            action = torch.rand(32, 2, generator=g) * 2 - 1
            seen = obs[:, 0, :6].mean((1, 2)) - obs[:, 1, 6:].mean((1, 2))  # what the pixels say
            reward = (10 * seen).unsqueeze(1) + 0.3 * action[:, :1]
            if bug:
                with torch.no_grad():
                    h = encoder(obs)  # the bug: the encoder's forward under no_grad
            else:
                h = encoder(obs)
            critic_loss = nn.functional.mse_loss(critic(h, action), reward)
            encoder_opt.zero_grad(set_to_none=True)
            critic_opt.zero_grad(set_to_none=True)
            critic_loss.backward()
            critic_opt.step()
            encoder_opt.step()  # steps every iteration, also when no gradient reached the encoder
            watch(s)
        return s.report()
