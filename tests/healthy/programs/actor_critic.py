"""Actor-critic on CartPole: one network, a policy head and a value head, and a summed loss.

Modelled on: pytorch/examples ``reinforcement_learning/actor_critic.py``
(https://github.com/pytorch/examples/blob/main/reinforcement_learning/actor_critic.py): a shared
``affine1`` layer, ``action_head`` and ``value_head``, discounted returns normalised per update,
advantage ``R - value.item()``, ``loss = policy_losses.sum() + smooth_l1(value, R).sum()``, Adam at
lr 3e-2 (1e-3 here, over a batch of eight episodes capped at 40 steps, played under
``no_grad`` and re-evaluated in one forward as SpinningUp's VPG does).

Why it is healthy: the policy part of the loss has the sign of the advantages, which are
centred, so the total moves up and down with the critic's error and the batch; the episodes get
longer (about 20 steps at the start, close to the cap by the end).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

import torch_sentinel

from ._cartpole import CartPole

MODELLED_ON = "https://github.com/pytorch/examples/blob/main/reinforcement_learning/actor_critic.py"
GAMMA, ENVS, MAX_STEPS, LR = 0.99, 8, 40, 1e-3


class Policy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.affine1 = nn.Linear(4, 128)
        self.action_head = nn.Linear(128, 2)
        self.value_head = nn.Linear(128, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.relu(self.affine1(x))
        return F.softmax(self.action_head(x), dim=-1), self.value_head(x).squeeze(-1)


def play_episodes(model: Policy, env: CartPole) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    obs = env.reset()
    alive = torch.ones(ENVS, dtype=torch.bool)
    observations, actions, rewards, masks = [], [], [], []
    with torch.no_grad():
        for _ in range(MAX_STEPS):
            probs, _ = model(obs)
            action = probs.multinomial(1).squeeze(1)
            observations.append(obs)
            actions.append(action)
            masks.append(alive.clone())
            obs, reward, done = env.step(action)
            rewards.append(reward * alive)
            alive &= ~done
            if not bool(alive.any()):
                break
    returns, running = [], torch.zeros(ENVS)
    for r in reversed(rewards):
        running = r + GAMMA * running
        returns.insert(0, running)
    mask = torch.stack(masks)
    return torch.stack(observations)[mask], torch.stack(actions)[mask], torch.stack(returns)[mask]


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(543)
    env = CartPole(ENVS, torch.Generator().manual_seed(543), max_steps=MAX_STEPS)
    model = Policy()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    eps = torch.finfo(torch.float32).eps
    with torch_sentinel.attach(model, optimizer, log_dir=log_dir) as sentinel:
        for _ in range(steps):
            obs, act, returns = play_episodes(model, env)
            returns = (returns - returns.mean()) / (returns.std() + eps)
            probs, values = model(obs)
            log_prob = torch.distributions.Categorical(probs).log_prob(act)
            advantage = returns - values.detach()
            policy_loss = (-log_prob * advantage).sum()
            value_loss = F.smooth_l1_loss(values, returns, reduction="sum")
            loss = (policy_loss + value_loss) / ENVS
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if progress is not None:
                progress.append(-len(obs) / ENVS)
        return sentinel.report()
