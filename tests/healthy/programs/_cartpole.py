"""A vectorised CartPole in plain torch, standing in for ``gymnasium``'s ``CartPole-v1``.

The dynamics, thresholds and reward follow gymnasium's ``classic_control/cartpole.py``
(https://github.com/Farama-Foundation/Gymnasium/blob/main/gymnasium/envs/classic_control/cartpole.py):
Euler integration at 0.02 s, a push of +-10 N, the episode ends when the pole leans past 12
degrees or the cart leaves +-2.4, reward 1 for every step survived, truncation at ``max_steps``.
Environments that end are reset automatically, as ``gymnasium.vector`` does.
"""

from __future__ import annotations

import math

import torch

GRAVITY, MASS_CART, MASS_POLE, HALF_LENGTH, FORCE, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
THETA_LIMIT, X_LIMIT = 12 * 2 * math.pi / 360, 2.4


class CartPole:
    """``n`` CartPoles stepped together; ``step(action)`` returns (obs, reward, done)."""

    def __init__(self, n: int, generator: torch.Generator, max_steps: int = 200) -> None:
        self.n, self.g, self.max_steps = n, generator, max_steps
        self.state = self._fresh(n)
        self.t = torch.zeros(n, dtype=torch.long)

    def _fresh(self, k: int) -> torch.Tensor:
        return torch.rand(k, 4, generator=self.g) * 0.1 - 0.05

    def reset(self) -> torch.Tensor:
        self.state = self._fresh(self.n)
        self.t.zero_()
        return self.state.clone()

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, x_dot, theta, theta_dot = self.state.unbind(1)
        force = action.to(torch.float32) * (2 * FORCE) - FORCE
        total = MASS_CART + MASS_POLE
        pml = MASS_POLE * HALF_LENGTH
        cos, sin = torch.cos(theta), torch.sin(theta)
        temp = (force + pml * theta_dot**2 * sin) / total
        theta_acc = (GRAVITY * sin - cos * temp) / (HALF_LENGTH * (4.0 / 3.0 - MASS_POLE * cos**2 / total))
        x_acc = temp - pml * theta_acc * cos / total
        x, x_dot = x + TAU * x_dot, x_dot + TAU * x_acc
        theta, theta_dot = theta + TAU * theta_dot, theta_dot + TAU * theta_acc
        self.t += 1
        done = (x.abs() > X_LIMIT) | (theta.abs() > THETA_LIMIT) | (self.t >= self.max_steps)
        state = torch.stack([x, x_dot, theta, theta_dot], 1)
        self.state = torch.where(done[:, None], self._fresh(self.n), state)
        self.t = torch.where(done, 0, self.t)
        return self.state, torch.ones(self.n), done
