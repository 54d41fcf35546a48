"""PPO with the clipped surrogate, GAE, minibatch epochs and an entropy bonus, on CartPole.

Modelled on: CleanRL ``cleanrl/ppo.py`` (https://github.com/vwxyzjn/cleanrl/blob/master/cleanrl/ppo.py):
an ``Agent`` with separate actor and critic MLPs (tanh, orthogonal init, actor output std 0.01),
no ``forward`` (the loop calls ``get_value`` and ``get_action_and_value``), Adam with eps 1e-5
and a learning rate annealed linearly to 0 (from 2.5e-3 here: CleanRL starts at 2.5e-4
for 500k environment steps, this run has 10k), 4 environments x 128 steps per rollout, GAE
(gamma 0.99, lambda 0.95), 4 epochs of 4 minibatches, normalised advantages, clip 0.2, clipped
value loss, entropy coefficient 0.01, value coefficient 0.5, ``clip_grad_norm_(0.5)``.

Why it is healthy: the loss is ``pg_loss - 0.01 * entropy + 0.5 * v_loss``. ``pg_loss`` is a
clipped surrogate of centred advantages, near zero and of either sign; the value loss jumps
whenever the policy improves and returns grow. Episodes get longer over the run.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import nn
from torch.distributions.categorical import Categorical

import torch_sentinel

from ._cartpole import CartPole

MODELLED_ON = "https://github.com/vwxyzjn/cleanrl/blob/master/cleanrl/ppo.py"
NUM_ENVS, NUM_STEPS, MINIBATCHES, EPOCHS = 4, 128, 4, 4
LR, GAMMA, GAE_LAMBDA, CLIP, ENT_COEF, VF_COEF, MAX_GRAD_NORM = 2.5e-3, 0.99, 0.95, 0.2, 0.01, 0.5, 0.5


def layer_init(layer: nn.Linear, std: float = float(np.sqrt(2)), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.critic = nn.Sequential(layer_init(nn.Linear(4, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)),
                                    nn.Tanh(), layer_init(nn.Linear(64, 1), std=1.0))
        self.actor = nn.Sequential(layer_init(nn.Linear(4, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)),
                                   nn.Tanh(), layer_init(nn.Linear(64, 2), std=0.01))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(self, x: torch.Tensor, action: Optional[torch.Tensor] = None):
        probs = Categorical(logits=self.actor(x))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(1)
    envs = CartPole(NUM_ENVS, torch.Generator().manual_seed(1), max_steps=200)
    agent = Agent()
    optimizer = torch.optim.Adam(agent.parameters(), lr=LR, eps=1e-5)
    batch_size = NUM_ENVS * NUM_STEPS
    minibatch_size = batch_size // MINIBATCHES
    updates_per_iteration = EPOCHS * MINIBATCHES
    iterations = -(-steps // updates_per_iteration)
    sentinel = torch_sentinel.attach(agent, optimizer, log_dir=log_dir)
    next_obs, next_done = envs.reset(), torch.zeros(NUM_ENVS)
    episode_len = torch.zeros(NUM_ENVS)
    done_updates = 0
    for iteration in range(iterations):
        optimizer.param_groups[0]["lr"] = (1.0 - iteration / iterations) * LR
        obs = torch.zeros(NUM_STEPS, NUM_ENVS, 4)
        actions, logprobs, rewards, dones, values = (torch.zeros(NUM_STEPS, NUM_ENVS) for _ in range(5))
        finished: list[float] = []
        for t in range(NUM_STEPS):
            obs[t], dones[t] = next_obs, next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
            values[t], actions[t], logprobs[t] = value.flatten(), action, logprob
            next_obs, rewards[t], done = envs.step(action)
            episode_len += 1
            finished += episode_len[done].tolist()
            episode_len[done] = 0
            next_done = done.float()
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards)
            lastgaelam = torch.zeros(NUM_ENVS)
            for t in reversed(range(NUM_STEPS)):
                nextnonterminal = 1.0 - (next_done if t == NUM_STEPS - 1 else dones[t + 1])
                nextvalues = next_value if t == NUM_STEPS - 1 else values[t + 1]
                delta = rewards[t] + GAMMA * nextvalues * nextnonterminal - values[t]
                lastgaelam = delta + GAMMA * GAE_LAMBDA * nextnonterminal * lastgaelam
                advantages[t] = lastgaelam
            returns = advantages + values
        b_obs, b_logprobs, b_actions = obs.reshape(-1, 4), logprobs.reshape(-1), actions.reshape(-1)
        b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)
        b_inds = np.arange(batch_size)
        for _epoch in range(EPOCHS):
            np.random.default_rng(iteration * EPOCHS + _epoch).shuffle(b_inds)
            for start in range(0, batch_size, minibatch_size):
                if done_updates == steps:
                    break
                mb = torch.as_tensor(b_inds[start:start + minibatch_size])
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions.long()[mb])
                ratio = (newlogprob - b_logprobs[mb]).exp()
                mb_adv = b_advantages[mb]
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                pg_loss = torch.max(-mb_adv * ratio, -mb_adv * torch.clamp(ratio, 1 - CLIP, 1 + CLIP)).mean()
                newvalue = newvalue.view(-1)
                v_unclipped = (newvalue - b_returns[mb]) ** 2
                v_clipped = b_values[mb] + torch.clamp(newvalue - b_values[mb], -CLIP, CLIP)
                v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - b_returns[mb]) ** 2).mean()
                loss = pg_loss - ENT_COEF * entropy.mean() + v_loss * VF_COEF
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), MAX_GRAD_NORM)
                optimizer.step()
                done_updates += 1
                if progress is not None and finished:
                    progress.append(-float(np.mean(finished)))
    report = sentinel.report()
    sentinel.detach()
    return report
