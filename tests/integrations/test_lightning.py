"""A real Lightning Trainer fit on CPU with SentinelCallback: its steps, its loggers, its clipping."""

from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Any, Optional

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from lightning.pytorch.utilities import grad_norm  # noqa: E402

import torch_sentinel  # noqa: E402
from torch_sentinel.integrations.lightning import SentinelCallback  # noqa: E402


class Regressor(pl.LightningModule):
    def __init__(self, nan_at: Optional[int] = None, scale: float = 1.0) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
        self.nan_at = nan_at
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.global_step == self.nan_at:
            x = x.clone()
            x[0, 0] = float("nan")
        loss = nn.functional.mse_loss(self(x) * self.scale, y)
        self.log("train_loss", loss)
        return loss

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        # Lightning's own gradient-norm utility, before Lightning clips.
        self.log_dict(grad_norm(self, norm_type=2))

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.001 if self.scale > 1 else 0.05)


class GAN(pl.LightningModule):
    """Lightning's GAN template in miniature: manual optimization, two optimizers, no forward()."""

    def __init__(self, nan_at: Optional[int] = None, restore_generator: bool = False) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 6), nn.Tanh())
        self.discriminator = nn.Sequential(nn.Linear(6, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
        self.nan_at = nan_at
        self.restore_generator = restore_generator

    def training_step(self, batch: Any, batch_idx: int) -> None:
        imgs, _ = batch
        if batch_idx == self.nan_at:
            imgs = imgs.clone()
            imgs[0, 0] = float("nan")
        opt_g, opt_d = self.optimizers()
        z = torch.randn(imgs.shape[0], 4)
        bce = nn.functional.binary_cross_entropy_with_logits
        ones, zeros = torch.ones(imgs.shape[0], 1), torch.zeros(imgs.shape[0], 1)
        g_loss = bce(self.discriminator(self.generator(z)), ones)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        self.clip_gradients(opt_g, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
        saved = [p.detach().clone() for p in self.generator.parameters()] if self.restore_generator else []
        opt_g.step()
        with torch.no_grad():  # the fault: the generator's update is undone after every step
            for p, q in zip(self.generator.parameters(), saved):
                p.copy_(q)
        real = bce(self.discriminator(imgs), ones)  # the batch enters a submodule from user code
        fake = bce(self.discriminator(self.generator(z).detach()), zeros)
        opt_d.zero_grad()
        self.manual_backward((real + fake) / 2)
        self.clip_gradients(opt_d, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
        opt_d.step()

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [torch.optim.Adam(self.generator.parameters(), lr=2e-4),
                torch.optim.Adam(self.discriminator.parameters(), lr=2e-4)]


class HeadSwap(Regressor):
    """Fine-tuning pattern: the head is replaced in on_train_start, and handed to the optimizer."""

    def on_train_start(self) -> None:
        self.net[2] = nn.Linear(16, 1)
        self.trainer.optimizers[0].param_groups[0]["params"] = list(self.parameters())


def _loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 6, generator=g)
    return DataLoader(TensorDataset(x, x[:, :1] * 2), batch_size=8)


def _fit(tmp_path: Path, module: Any, callback: SentinelCallback, val: bool = True, **kwargs: Any) -> Any:
    settings: dict[str, Any] = {"max_epochs": 2, **kwargs}
    trainer = pl.Trainer(
        default_root_dir=str(tmp_path), accelerator="cpu", devices=1,
        callbacks=[callback], enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, num_sanity_val_steps=0, log_every_n_steps=1, **settings,
    )
    trainer.fit(module, _loader(), _loader() if val else None)
    return trainer


def _csv(trainer: Any) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    with open(Path(trainer.logger.log_dir) / "metrics.csv") as f:
        for row in csv.DictReader(f):
            rows.setdefault(int(row["step"]), {}).update({k: float(v) for k, v in row.items() if v and k != "step"})
    return rows


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
    assert {"train_loss", "sentinel/grad_norm", "grad_norm/net.0"} <= tags


def test_clipped_fit_logs_preclip_norms_through_the_csv_logger(tmp_path: Path) -> None:
    callback = SentinelCallback(flush_every=3)
    trainer = _fit(tmp_path, Regressor(scale=30.0), callback, val=False, gradient_clip_val=0.5,
                   logger=CSVLogger(str(tmp_path)))
    rows = _csv(trainer)
    steps = [s for s in rows if "sentinel/grad_norm" in rows[s]]
    assert steps == list(range(16))  # Lightning's global_step, every step (log_every_n_steps=1)
    for s in steps:
        # Lightning's own grad_norm utility saw the gradients before it clipped them.
        assert rows[s]["sentinel/grad_norm"] == pytest.approx(rows[s]["grad_2.0_norm_total"], rel=1e-5)
        assert rows[s]["sentinel/grad_norm"] > 10
        assert rows[s]["sentinel/grad_norm_clipped"] == pytest.approx(0.5, rel=1e-4)
        assert rows[s]["sentinel/nonfinite"] == 0.0
    assert rows[0]["sentinel/findings"] == 0.0


def test_manual_optimization_with_two_optimizers_counts_in_global_step(tmp_path: Path) -> None:
    callback = SentinelCallback(flush_every=4)
    trainer = _fit(tmp_path, GAN(), callback, val=False, max_epochs=1, logger=CSVLogger(str(tmp_path)))
    assert trainer.global_step == 16  # 8 batches, two optimizer steps each
    assert callback.sentinel is not None and callback.sentinel.step == 16
    logged = [s for s, row in _csv(trainer).items() if "sentinel/loss" in row]
    assert logged == list(range(0, 16, 2))


@pytest.mark.parametrize("restore", [False, True], ids=["healthy", "generator_update_undone"])
def test_no_update_under_manual_optimization_with_two_optimizers(tmp_path: Path, restore: bool) -> None:
    """Regression: Lightning numbers the rows 0, 2, 4, ... here (two optimizer steps per batch),
    and no_update compared only rows whose step numbers were consecutive, so it never compared
    any: a generator whose update is undone after every step went unseen."""
    callback = SentinelCallback(flush_every=4)
    _fit(tmp_path, GAN(restore_generator=restore), callback, val=False, max_epochs=1)
    assert callback.sentinel is not None
    found = callback.sentinel.report(all_ranks=False).by_kind("no_update")
    if not restore:
        assert found == []
        return
    (f,) = found
    assert (f.module or "").startswith("generator") and f.onset_step == 0 and f.step is not None and f.step % 2 == 0
    assert "the weights were restored between steps" in f.message


def test_nan_batch_into_a_submodule_is_a_data_fault_at_the_global_step(tmp_path: Path) -> None:
    callback = SentinelCallback()
    with pytest.raises(torch_sentinel.NonFiniteError, match=r"step 6, boundary 'data'") as info:
        _fit(tmp_path, GAN(nan_at=3), callback, val=False, max_epochs=1)
    assert info.value.step == 6 and info.value.module is None
    assert callback.sentinel is not None and not callback.sentinel.attached


def test_nan_surfaces_as_nonfinite_error_from_fit(tmp_path: Path) -> None:
    callback = SentinelCallback()
    console = logging.getLogger("lightning.pytorch")
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    console.addHandler(handler)
    try:
        with pytest.raises(torch_sentinel.NonFiniteError, match=r"step 5, boundary 'data'") as info:
            _fit(tmp_path, Regressor(nan_at=5), callback)
    finally:
        console.removeHandler(handler)
    assert info.value.step == 5
    assert callback.sentinel is not None and not callback.sentinel.attached
    # The finding also reached Lightning's own console logger, in its step numbering.
    assert any("non_finite (data)" in line and "global_step 5" in line for line in lines), lines


def test_head_replaced_in_on_train_start_is_mapped(tmp_path: Path) -> None:
    """Regression: attaching at on_fit_start mapped the old head; the new one was '<unknown>'."""
    callback = SentinelCallback(flush_every=4)
    _fit(tmp_path, HeadSwap(), callback, val=False)
    assert callback.sentinel is not None
    report = callback.sentinel.report(all_ranks=False)
    assert report.ok, str(report)
