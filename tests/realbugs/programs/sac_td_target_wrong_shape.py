"""A soft actor-critic for a 4-dimensional action space computes the entropy term with
``dist.log_prob(action)`` without summing over the action dimension, so the TD target has shape
(B, 4) while the critic's Q-value has shape (B, 1): ``F.mse_loss`` broadcasts them to (B, 4) and
the critic regresses on four different targets at once, with only a UserWarning. The author's fix:
reduce the log-probability over the action dimension.

Source: sunwuzhou03/reinforcement-learning-lab#1 "MSE warning" (``UserWarning: Using a target size
(torch.Size([64, 4])) that is different to the input size (torch.Size([64, 1]))``; "Shouldn't
log_prob be reduce dim?"; author: "Thanks, I have fix it"),
https://github.com/sunwuzhou03/reinforcement-learning-lab/issues/1 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/sunwuzhou03/reinforcement-learning-lab/issues/1"
CLASS = "loss input and target broadcast to a larger shape"
KIND, MODULE, CAUSE, ONSET = "loss_broadcast", None, None, 0


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    critic = nn.Sequential(nn.Linear(10 + 4, 64), nn.ReLU(), nn.Linear(64, 1))
    actor_mean = nn.Linear(10, 4).requires_grad_(False)  # the current policy (its update is elsewhere)
    opt = torch.optim.Adam(critic.parameters(), lr=1e-2)
    alpha, gamma = 0.2, 0.9
    g = torch.Generator().manual_seed(1)
    # a replay buffer of 1024 transitions
    buf_s = torch.randn(1024, 10, generator=g)
    buf_a = torch.rand(1024, 4, generator=g) * 2 - 1
    buf_r = -(buf_a ** 2).sum(1, keepdim=True) + buf_s[:, :1]
    buf_s2 = buf_s + 0.1 * torch.randn(1024, 10, generator=g)
    with torch_sentinel.attach(critic, opt) as s:
        for _ in range(40):
            idx = torch.randint(0, 1024, (256,), generator=g)
            states, actions, rewards, next_states = buf_s[idx], buf_a[idx], buf_r[idx], buf_s2[idx]
            with torch.no_grad():
                dist = torch.distributions.Normal(actor_mean(next_states), 0.5)
                normal_sample = dist.sample()
                log_prob = dist.log_prob(normal_sample)  # (64, 4)
                if not bug:
                    log_prob = log_prob.sum(1, keepdim=True)  # the fix: one log-probability per action
                next_q = critic(torch.cat([next_states, normal_sample.tanh()], 1))
                td_target = rewards + gamma * (next_q - alpha * log_prob)
            opt.zero_grad()
            nn.functional.mse_loss(critic(torch.cat([states, actions], 1)), td_target).backward()
            opt.step()
            watch(s)
        return s.report()
