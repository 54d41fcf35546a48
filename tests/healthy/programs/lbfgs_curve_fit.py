"""A small MLP fitted to a smooth curve with L-BFGS and a strong-Wolfe line search: the loss falls ~1000x in 20 steps.

Modelled on: the data-fitting stage of physics-informed network codes that finish with
``torch.optim.LBFGS(model.parameters(), lr=1, max_iter=..., history_size=50,
line_search_fn="strong_wolfe")`` and ``optimizer.step(closure)`` (e.g. rezaakb/pinns-torch,
https://github.com/rezaakb/pinns-torch, and the ``torch.optim.LBFGS`` docs,
https://pytorch.org/docs/stable/generated/torch.optim.LBFGS.html): a 1-32-32-1 tanh MLP fitted
to 128 samples of a damped oscillation ``exp(-x) * sin(5x)`` on [0, 3], full batch, mean squared
error, ``closure`` doing ``zero_grad / loss / backward / return loss``.

Why it is healthy: a quasi-Newton method on a smooth, noise-free, full-batch problem converges
fast: the loss falls by about three orders of magnitude within 20 steps (each of up to 20
inner iterations; 0.096 to 8e-5), and the first steps move the weights a long way relative to
their size. From step ~47 it has converged (loss 6.2e-7): every further ``step(closure)``
stops at L-BFGS's own test on the search direction (``tolerance_change``) without moving the
weights, although the gradient (norm 3.7e-4) is not exactly 0; a fixed-epoch loop keeps calling
it, as such loops do once L-BFGS has converged.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

MODELLED_ON = "https://github.com/rezaakb/pinns-torch"


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(0)
    x = torch.linspace(0, 3, 128).unsqueeze(1)
    y = torch.exp(-x) * torch.sin(5 * x)
    model = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.LBFGS(model.parameters(), lr=1, max_iter=20, history_size=50,
                                  line_search_fn="strong_wolfe")
    mse = nn.MSELoss()

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = mse(model(x), y)
        loss.backward()
        return loss

    sentinel = torch_sentinel.attach(model, optimizer, log_dir=log_dir)
    for _ in range(steps):
        loss = optimizer.step(closure)
        if progress is not None:
            progress.append(loss.item())
    report = sentinel.report()
    sentinel.detach()
    return report
