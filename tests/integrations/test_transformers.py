"""A real Hugging Face Trainer on a tiny model built from a config (no download)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it on PyTorch

import torch_sentinel  # noqa: E402
from torch_sentinel.integrations.transformers import SentinelTrainerCallback  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 32, seq: int = 8, vocab: int = 50) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _trainer(tmp_path: Path, nan_at: Optional[int] = None) -> Any:
    config = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    if nan_at is not None:
        steps = {"n": 0}

        def poison(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
            # The NaN starts in the first block's MLP at one step: a forward fault to locate.
            if torch.is_grad_enabled():
                steps["n"] += 1
                if steps["n"] == nan_at + 1:
                    return output * float("nan")
            return output

        model.transformer.h[0].mlp.c_fc.register_forward_hook(poison)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=6,
        learning_rate=1e-3, report_to=["tensorboard"], logging_steps=1, save_strategy="no",
        use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
    )
    return transformers.Trainer(model=model, args=args, train_dataset=Tokens())


def test_healthy_training_is_quiet_and_writes_next_to_the_trainer(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path)
    callback = SentinelTrainerCallback.install(trainer, flush_every=2)
    trainer.train()
    sentinel = callback.sentinel
    assert sentinel is not None and not sentinel.attached
    report = sentinel.report(all_ranks=False)
    assert report.ok, str(report)
    assert report.steps == 6
    tb_callbacks = [cb for cb in trainer.callback_handler.callbacks if type(cb).__name__ == "TensorBoardCallback"]
    tb_dir = Path(tb_callbacks[0].logging_dir)
    assert len(list(tb_dir.glob("events.out.tfevents.*"))) >= 2


def test_nan_surfaces_as_nonfinite_error_from_train(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, nan_at=3)
    callback = SentinelTrainerCallback.install(trainer)
    try:
        with pytest.raises(torch_sentinel.NonFiniteError, match=r"step 3, boundary 'forward'") as info:
            trainer.train()
    finally:
        callback.close_after_error()
    assert info.value.module == "transformer.h.0.mlp.c_fc"
    assert callback.sentinel is not None and not callback.sentinel.attached
