"""REINFORCE on CartPole: a noisy policy-gradient surrogate that changes sign.

Modelled on: pytorch/examples ``reinforcement_learning/reinforce.py``
(https://github.com/pytorch/examples/blob/main/reinforcement_learning/reinforce.py): a two-layer
policy, Adam, discounted returns (gamma 0.99) normalised to zero mean and unit variance per
update, ``policy_loss = (-log_prob * R).sum()`` (here divided by the number of episodes, with lr
1e-3 where the example takes lr 1e-2 on one episode per update). Batched the way SpinningUp's VPG
does it (https://github.com/openai/spinningup/blob/master/spinup/algos/pytorch/vpg/vpg.py):
eight environments play one episode each under ``no_grad``, then one forward over the stored
observations gives the log-probabilities. The episode is capped at 50 steps to keep the run short.

Why it is healthy: the surrogate is not a loss that should fall. With normalised returns it sits
around zero and changes sign from batch to batch; what must rise is the episode length, and it
does (about 20 steps at the start, near the 50-step cap by the end).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

from ._cartpole import CartPole

MODELLED_ON = "https://github.com/pytorch/examples/blob/main/reinforcement_learning/reinforce.py"
GAMMA, ENVS, MAX_STEPS = 0.99, 8, 50
LR = 1e-3


class Policy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.affine1 = nn.Linear(4, 128)
        self.affine2 = nn.Linear(128, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.affine2(torch.relu(self.affine1(x))), dim=-1)


def play_episodes(policy: Policy, env: CartPole) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One episode per environment; returns observations, actions and discounted returns."""
    obs = env.reset()
    alive = torch.ones(ENVS, dtype=torch.bool)
    observations, actions, rewards, masks = [], [], [], []
    with torch.no_grad():
        for _ in range(MAX_STEPS):
            action = policy(obs).multinomial(1).squeeze(1)
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
    policy = Policy()
    optimizer = torch.optim.Adam(policy.parameters(), lr=LR)
    eps = torch.finfo(torch.float32).eps
    sentinel = torch_sentinel.attach(policy, optimizer, log_dir=log_dir)
    for _ in range(steps):
        obs, act, returns = play_episodes(policy, env)
        returns = (returns - returns.mean()) / (returns.std() + eps)
        log_prob = torch.distributions.Categorical(policy(obs)).log_prob(act)
        policy_loss = (-log_prob * returns).sum() / ENVS
        optimizer.zero_grad()
        policy_loss.backward()
        optimizer.step()
        if progress is not None:
            progress.append(-len(obs) / ENVS)  # minus the mean episode length
    report = sentinel.report()
    sentinel.detach()
    return report
