"""The six injected causes of a loss spike, each drawn from a seed, and the clean runs.

Every injection changes one thing at a known step ``t0`` of a run that resumes a trained
checkpoint (``train.py``), and names the module it was injected into (``module``): the first
mover the forensics should find (``None`` for a bad batch, which enters through the data).

============================  ==================================================================
cause                         what is done, from ``t0``
============================  ==================================================================
``learning_rate``             one block's param group gets its lr multiplied by 50-300 for 5 steps
``bad_batch``                 one batch of random bytes (0-255, outside the text's ASCII) or of
                              random printable ASCII (in range)
``adam_second_moment``        (beta2 = 0.999, lr 2e-3) the first block gets zero gradients for 20,000
                              steps, then its gradient returns at ``t0``: the last 24 zero steps
                              run (inside the forensics' window), the 19,976 before are applied to
                              its Adam state as AdamW's own updates would (m, v decayed by beta^n,
                              the step count advanced)
``attention_logits``          the first attention layer's queries and keys drift along a shared
                              direction by 0.5-2 x k^2 at the k-th step: its largest logit grows
                              step by step
``output_logits``             the output logits are multiplied by r = 1.15-1.3 more every step: their
                              log-sum-exp drifts
``corrupted_weight``          4 elements of one weight (or norm gain) multiplied by 2^10-2^20 between
                              two steps, as corrupted exponent bits do
============================  ==================================================================

What it took for each cause to make a real spike (robust z > 6) on this model, found on the
tuning split: at beta2 = 0.95 no zero-gradient stretch of the modules tried spiked the loss (the
update after it is at most 1.1 lr per element, as the prior-art caveat computes); at 0.999
(up to 6.5 lr per element) one MLP's burst raised the loss by 0.3-0.5 over 20-40 steps, never
a spike, and a whole bottom block's burst spiked it at lr 2e-3 (z 11), not at 1e-3 (z 5); the
second block's did not at 2e-3 (3 tries on the tuning split).
Drift in attention layers 1-3 raised the loss by at most 0.45 (z < 4): only the first layer's
attention carries enough of this small model's function. The published tables say so.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any, Optional

import torch

from .model import GPT

__all__ = ["CAUSES", "Injection", "draw"]

CAUSES = ("learning_rate", "bad_batch", "adam_second_moment", "attention_logits", "output_logits", "corrupted_weight")

_WEIGHTS = ("ln1", "attn.qkv", "attn.proj", "ln2", "mlp.fc1", "mlp.fc2")


@dataclasses.dataclass(frozen=True)
class Injection:
    cause: str
    t0: int
    module: Optional[str]
    params: dict[str, Any]

    @property
    def beta2(self) -> float:
        return 0.999 if self.cause == "adam_second_moment" else 0.95

    @property
    def lr(self) -> float:
        return 2e-3 if self.cause == "adam_second_moment" else 1e-3

    def describe(self) -> str:
        detail = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.params.items())
        return f"{self.cause} at {self.module or 'the batch'} from step {self.t0} ({detail})"

    # -- hooks of the training loop (train.py) -----------------------------------------------
    def batch(self, step: int, x: torch.Tensor, y: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cause != "bad_batch" or step != self.t0:
            return x, y
        lo, hi = (0, self.params.get("high", 256)) if self.params["kind"] == "random_bytes" else (32, 127)
        rows = torch.randint(lo, hi, (x.shape[0], x.shape[1] + 1), generator=g)
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def before_forward(self, step: int, model: GPT, opt: torch.optim.Optimizer, g: torch.Generator) -> None:
        c, p = self.cause, self.params
        if c == "learning_rate" and self.t0 <= step < self.t0 + p["steps"]:
            for group in opt.param_groups:
                if group["name"] == self.module:
                    group["lr"] *= p["factor"]
        elif c == "attention_logits" and step >= self.t0:
            attn = model.get_submodule(str(self.module))
            attn.qk_drift = p["drift"] * (step - self.t0 + 1) ** 2  # type: ignore[assignment]
        elif c == "output_logits" and step >= self.t0:
            model.out_temperature = p["rate"] ** (step - self.t0 + 1)
        elif c == "corrupted_weight" and step == self.t0:
            weight = model.get_submodule(str(self.module)).weight
            with torch.no_grad():
                flat = weight.view(-1)
                index = torch.randperm(flat.numel(), generator=g)[: p["elements"]]
                flat[index] *= 2.0 ** p["exponent"]
        elif c == "adam_second_moment" and step == self.t0 - p["zero_steps"]:
            self._decay_state(model, opt, p["stretch"] - p["zero_steps"])

    def after_backward(self, step: int, model: GPT) -> None:
        """The zero-gradient stretch before ``t0`` (adam_second_moment)."""
        if self.cause == "adam_second_moment" and self.t0 - self.params["zero_steps"] <= step < self.t0:
            for p in model.get_submodule(str(self.module)).parameters():
                if p.grad is not None:
                    p.grad.zero_()

    def _decay_state(self, model: GPT, opt: torch.optim.Optimizer, n: int) -> None:
        """The optimizer state of ``module`` after ``n`` steps of zero gradient: what AdamW's
        own updates would leave (m and v decay geometrically, the step count grows), without
        running the stretch. The weights are left as they are, as weight decay 0 would leave
        them: shrunk at once by a stretch's decay, they would make a spike of their own at the
        stretch's start, where the rest of the network had no time to adapt."""
        for p in model.get_submodule(str(self.module)).parameters():
            state = opt.state[p]
            group = next(g for g in opt.param_groups if any(q is p for q in g["params"]))
            beta1, beta2 = group["betas"]
            del group
            with torch.no_grad():
                state["exp_avg"].mul_(beta1**n)
                state["exp_avg_sq"].mul_(beta2**n)
                state["step"] += n


def draw(cause: str, seed: int, layers: int = 4) -> Injection:
    """The injection of ``cause`` drawn from ``seed``: target, strength and onset."""
    rng = random.Random(f"{cause}:{seed}")
    t0 = rng.randrange(150, 200)
    block = f"blocks.{rng.randrange(layers)}"
    if cause == "learning_rate":
        factor = math.exp(rng.uniform(math.log(50), math.log(300)))
        return Injection(cause, t0, block, {"factor": factor, "steps": 5})
    if cause == "bad_batch":
        return Injection(cause, t0, None, {"kind": rng.choice(["random_bytes", "random_ascii"])})
    if cause == "adam_second_moment":
        return Injection(cause, t0, "blocks.0", {"stretch": 20_000, "zero_steps": 24})
    if cause == "attention_logits":
        return Injection(cause, t0, "blocks.0.attn", {"drift": rng.uniform(0.5, 2.0)})
    if cause == "output_logits":
        return Injection(cause, t0, "head", {"rate": rng.uniform(1.15, 1.3)})
    if cause == "corrupted_weight":
        module = f"{block}.{rng.choice(_WEIGHTS)}"
        return Injection(cause, t0, module, {"elements": 4, "exponent": rng.randrange(10, 21)})
    raise ValueError(f"unknown cause {cause!r}; expected one of {CAUSES}")
