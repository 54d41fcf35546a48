"""A LightningModule classifier fit by a ``Trainer`` with the sentinel's Lightning callback.

Modelled on: Lightning-AI/pytorch-lightning ``examples/pytorch/basics/backbone_image_classifier.py``
(``LitClassifier(LightningModule)`` with a backbone, ``training_step`` returning
``F.cross_entropy(self(x), y)``, ``validation_step`` logging ``val_loss``,
``configure_optimizers`` returning ``torch.optim.Adam(self.parameters(), lr=...)``) and the
Lightning docs' ``configure_optimizers`` returning ``{"optimizer": ..., "lr_scheduler": ...}``.
Lightning calls ``train()``/``eval()``, ``zero_grad``, ``backward`` and ``step`` itself; the
script adds ``callbacks=[SentinelCallback()]``.

Data: 16-D Gaussian blobs, four classes.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from realworld.harness import Bug
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

MODELLED_ON = "Lightning-AI/pytorch-lightning examples/pytorch/basics/backbone_image_classifier.py"
HEALTHY_XFAIL: Optional[str] = None
BUGS = {
    "softmax_backbone_output": Bug("nn.Softmax(dim=1) appended to the network before F.cross_entropy",
                                   "probabilities_as_logits", module="net.3"),
    "dead_relu_init": Bug("nn.init.constant_(self.net[0].bias, -10.0) in __init__", "dead_relu",
                          module="net.1"),
}


def make_module(bug: Optional[str]) -> Any:
    import lightning.pytorch as pl

    class LitClassifier(pl.LightningModule):
        def __init__(self, learning_rate: float = 1e-2) -> None:
            super().__init__()
            self.save_hyperparameters()
            layers: list[nn.Module] = [nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)]
            if bug == "softmax_backbone_output":
                layers.append(nn.Softmax(dim=1))
            self.net = nn.Sequential(*layers)
            if bug == "dead_relu_init":
                nn.init.constant_(self.net[0].bias, -10.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = F.cross_entropy(self(x), y)
            self.log("train_loss", loss)
            self.losses.append(loss.item())
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", F.cross_entropy(self(x), y))

        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
            return {"optimizer": optimizer, "lr_scheduler": scheduler}

    module = LitClassifier()
    module.losses = []
    return module


def blobs(n: int, g: torch.Generator) -> TensorDataset:
    centers = torch.randn(4, 16, generator=torch.Generator().manual_seed(7)) * 1.5
    y = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset(centers[y] + torch.randn(n, 16, generator=g), y)


def run(bug: Optional[str] = None, log_dir: Optional[str] = None) -> list[float]:
    import lightning.pytorch as pl

    from torch_sentinel.integrations.lightning import SentinelCallback

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    train = DataLoader(blobs(640, g), batch_size=32, shuffle=True, generator=g)
    val = DataLoader(blobs(128, g), batch_size=64)
    module = make_module(bug)
    trainer = pl.Trainer(max_epochs=2, callbacks=[SentinelCallback(log_dir=log_dir)],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu",
                         devices=1)
    trainer.fit(module, train, val)
    return module.losses
