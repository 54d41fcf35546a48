"""A real Lightning Trainer fit on CPU with SentinelCallback: quiet when healthy, NaN surfaces."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

pl = pytest.importorskip("lightning.pytorch")

import torch_sentinel  # noqa: E402
from torch_sentinel.integrations.lightning import SentinelCallback  # noqa: E402


class Regressor(pl.LightningModule):
    def __init__(self, nan_at: Optional[int] = None) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
        self.nan_at = nan_at

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.global_step == self.nan_at:
            x = x.clone()
            x[0, 0] = float("nan")
        loss = nn.functional.mse_loss(self(x), y)  # through __call__: the batch is seen as data
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 6, generator=g)
    return DataLoader(TensorDataset(x, x[:, :1] * 2), batch_size=8)


def _fit(tmp_path: Path, module: Regressor, callback: SentinelCallback) -> Any:
    trainer = pl.Trainer(
        default_root_dir=str(tmp_path), max_epochs=2, accelerator="cpu", devices=1,
        callbacks=[callback], enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, num_sanity_val_steps=0, log_every_n_steps=1,
    )
    trainer.fit(module, _loader(), _loader())
    return trainer


def test_healthy_fit_is_quiet_and_streams_into_the_tensorboard_dir(tmp_path: Path) -> None:
    callback = SentinelCallback(flush_every=4)
    trainer = _fit(tmp_path, Regressor(), callback)
    sentinel = callback.sentinel
    assert sentinel is not None and not sentinel.attached  # detached at teardown
    report = sentinel.report(all_ranks=False)
    assert report.ok, str(report)
    assert report.steps == trainer.global_step == 16
    tb_dir = Path(trainer.logger.log_dir)
    # Lightning's events and the sentinel's events side by side in one TensorBoard run.
    assert len(list(tb_dir.glob("events.out.tfevents.*"))) >= 2
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    for f in tb_dir.glob("events.out.tfevents.*"):
        acc = EventAccumulator(str(f))
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    assert "train_loss" in tags
    assert any(t != "train_loss" and t not in ("val_loss", "epoch") for t in tags), tags


def test_gradient_norms_recorded_inside_the_closure(tmp_path: Path) -> None:
    """Lightning runs forward and backward inside optimizer.step(closure)."""
    callback = SentinelCallback(flush_every=1000)
    _fit(tmp_path, Regressor(), callback)
    assert callback.sentinel is not None
    rec = [r for r in callback.sentinel._recent if r.meta.backward_calls][-1]  # the last training step
    assert rec.meta.grad_missing == ()
    assert (rec.array("grad_norm") > 0).all()


def test_nan_surfaces_as_nonfinite_error_from_fit(tmp_path: Path) -> None:
    callback = SentinelCallback()
    with pytest.raises(torch_sentinel.NonFiniteError, match=r"step 5, boundary 'data'") as info:
        _fit(tmp_path, Regressor(nan_at=5), callback)
    assert info.value.step == 5
    assert callback.sentinel is not None and not callback.sentinel.attached
