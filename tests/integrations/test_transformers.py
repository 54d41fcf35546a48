"""A real Hugging Face Trainer on a tiny model built from a config (no download), clipping on."""

from __future__ import annotations

import logging
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


def _trainer(tmp_path: Path, nan_at: Optional[int] = None, callbacks: Optional[list[Any]] = None,
             **args: Any) -> Any:
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
    settings: dict[str, Any] = {
        "output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 4, "max_steps": 6,
        "learning_rate": 1e-3, "report_to": ["tensorboard"], "logging_steps": 1, "save_strategy": "no",
        "use_cpu": True, "disable_tqdm": True, "dataloader_num_workers": 0, **args,
    }
    # Clipping on, as by default (max_grad_norm=1.0); the healthy test clips at 0.25, below
    # this model's norms (~0.8), so that every step really clips.
    return transformers.Trainer(model=model, args=transformers.TrainingArguments(**settings), train_dataset=Tokens(),
                                callbacks=callbacks)


def test_healthy_training_logs_preclip_norms_through_the_trainer(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, gradient_accumulation_steps=2, max_grad_norm=0.25, max_steps=4)
    callback = SentinelTrainerCallback.install(trainer, flush_every=2)
    trainer.train()
    sentinel = callback.sentinel
    assert sentinel is not None and not sentinel.attached
    report = sentinel.report(all_ranks=False)
    assert report.ok, str(report)
    history = trainer.state.log_history
    hf = {h["step"]: h for h in history if "grad_norm" in h}
    ours = {h["step"]: h for h in history if "sentinel/grad_norm" in h}
    assert sorted(hf) == sorted(ours) == [1, 2, 3, 4]  # the Trainer's numbering
    for step in hf:
        assert hf[step]["grad_norm"] > 0.25  # the Trainer clipped
        assert ours[step]["sentinel/grad_norm"] == pytest.approx(hf[step]["grad_norm"], rel=1e-4)
        assert ours[step]["sentinel/grad_norm_clipped"] == pytest.approx(0.25, rel=1e-4)
        # The mean of the two micro-batch losses, as the Trainer logs it.
        assert ours[step]["sentinel/loss"] == pytest.approx(hf[step]["loss"], rel=1e-4)
    # report_to receives them: the Trainer's own TensorBoard run has them.
    tb_callbacks = [cb for cb in trainer.callback_handler.callbacks if type(cb).__name__ == "TensorBoardCallback"]
    tb_dir = Path(tb_callbacks[0].logging_dir)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    for f in tb_dir.glob("events.out.tfevents.*"):
        acc = EventAccumulator(str(f))
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    assert {"train/sentinel/grad_norm", "grad_norm/global", "grad_norm/transformer.h.0.mlp.c_fc"} <= tags


def test_nan_surfaces_at_the_trainers_step_and_detaches_by_itself(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, nan_at=3)
    callback = SentinelTrainerCallback.install(trainer)
    console = logging.getLogger("transformers.trainer")
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    console.addHandler(handler)
    try:
        with pytest.raises(torch_sentinel.NonFiniteError, match=r"step 4, boundary 'forward'") as info:
            trainer.train()
    finally:
        console.removeHandler(handler)
    assert info.value.module == "transformer.h.0.mlp.c_fc"
    assert callback.sentinel is not None and not callback.sentinel.attached  # no close_after_error()
    # The finding also reached the Trainer's console logger, in its step numbering.
    assert any("non_finite (forward)" in line and "state.global_step 4" in line for line in lines), lines


class _FailsAt(transformers.TrainerCallback):
    """A user's callback that raises at the start of one step (not the sentinel's error)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            raise RuntimeError("user callback failed")


@pytest.mark.parametrize("error", ["nan", "user-error"], ids=["nonfinite-error", "another-error"])
def test_a_callback_passed_to_the_trainer_detaches_and_completes_its_files_on_an_error(
        tmp_path: Path, error: str) -> None:
    """``Trainer(callbacks=[SentinelTrainerCallback()])``, not install(): an error inside
    ``trainer.train()`` still leaves the hooks removed and the files complete, without
    ``close_after_error()``."""
    import json

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    backward = torch.autograd.backward
    callback = SentinelTrainerCallback(log_dir=str(tmp_path / "sentinel"), flush_every=50)
    extra: list[Any] = [] if error == "nan" else [_FailsAt(3)]
    trainer = _trainer(tmp_path, nan_at=3 if error == "nan" else None, callbacks=[callback, *extra])
    expected = torch_sentinel.NonFiniteError if error == "nan" else RuntimeError
    with pytest.raises(expected):
        trainer.train()
    sentinel = callback.sentinel
    assert sentinel is not None and not sentinel.attached
    assert torch.autograd.backward is backward  # the patches went with the detach
    manifest = json.loads((tmp_path / "sentinel" / "manifest.json").read_text())
    assert "result" in manifest  # completed at detach
    acc = EventAccumulator(str(tmp_path / "sentinel"), size_guidance={"scalars": 0})
    acc.Reload()
    steps = [e.step for e in acc.Scalars("loss/train")]
    # Every step that completed reached the files, although flush_every was never reached.
    assert steps[:3] == [1, 2, 3] if error == "nan" else steps == [1, 2, 3]
    if error == "nan":
        findings = (tmp_path / "sentinel" / "findings.jsonl").read_text()
        assert "non_finite" in findings
