"""Fine-tuning a (tiny, config-built, briefly pretrained) BERT classifier with the Hugging Face ``Trainer``.

Modelled on: huggingface/transformers ``examples/pytorch/text-classification/run_glue.py``
(https://github.com/huggingface/transformers/blob/main/examples/pytorch/text-classification/run_glue.py):
``AutoModelForSequenceClassification`` on a pretrained encoder, ``Trainer(model, args,
train_dataset, ...)``, ``trainer.train()`` with the Trainer's defaults (AdamW, linear decay,
``max_grad_norm=1.0``, weight decay 0), a 10% warm-up (``warmup_steps=0.1``), and the learning rate the BERT
miniatures recommend for 2-layer models (3e-4, https://github.com/google-research/bert). No hub
download: a ``BertForMaskedLM`` built from a small ``BertConfig`` is pretrained in the program
with masked-token prediction for 150 steps on unlabelled text from the same distribution, and
its encoder is loaded into ``BertForSequenceClassification``, as ``from_pretrained`` would. The
sentinel is attached with the one line ``SentinelTrainerCallback.install(trainer)``.

Why it is healthy: the usual fine-tuning picture. The classifier head and the pooler are new,
the encoder is pretrained and is adjusted at the same small rate; gradients are clipped at 1.
The loss sits near ln 2 through the warm-up and the first ~80 steps, then falls to about 0.2.
Task: is a sentence made mostly of "positive" or of "negative" words (drawn among neutral
filler words)?
"""

from __future__ import annotations

import tempfile
from typing import Optional

import torch

import torch_sentinel

MODELLED_ON = "https://github.com/huggingface/transformers/blob/main/examples/pytorch/text-classification/run_glue.py"
VOCAB, SEQ, CLS, SEP, MASK, PAD = 40, 16, 2, 3, 4, 0


def sentences(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.randint(0, 2, (n,), generator=g)
    ids = torch.randint(20, VOCAB, (n, SEQ), generator=g)  # neutral words
    polar = torch.rand(n, SEQ, generator=g) < 0.5
    major = torch.randint(5, 12, (n, SEQ), generator=g) + 7 * labels[:, None]  # 5-11 negative, 12-18 positive
    minor = torch.randint(5, 12, (n, SEQ), generator=g) + 7 * (1 - labels[:, None])
    words = torch.where(torch.rand(n, SEQ, generator=g) < 0.8, major, minor)
    ids = torch.where(polar, words, ids)
    ids[:, 0], ids[:, -1] = CLS, SEP
    return ids, labels


class Sentences(torch.utils.data.Dataset):
    def __init__(self, n: int, g: torch.Generator) -> None:
        self.ids, self.labels = sentences(n, g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": self.labels[i]}


def pretrained_encoder_state(config, g: torch.Generator) -> dict[str, torch.Tensor]:
    from transformers import BertForMaskedLM

    mlm = BertForMaskedLM(config)
    opt = torch.optim.AdamW(mlm.parameters(), lr=1e-3)
    mlm.train()
    for _ in range(150):
        ids, _ = sentences(32, g)
        masked = (torch.rand(ids.shape, generator=g) < 0.15) & (ids > SEP)
        labels = torch.where(masked, ids, torch.tensor(-100))
        loss = mlm(input_ids=torch.where(masked, torch.tensor(MASK), ids), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k[len("bert."):]: v for k, v in mlm.state_dict().items() if k.startswith("bert.")}


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    from torch_sentinel.integrations.transformers import SentinelTrainerCallback

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=SEQ, num_labels=2)
    encoder_state = pretrained_encoder_state(config, g)
    model = BertForSequenceClassification(config)
    model.bert.load_state_dict(encoder_state, strict=False)  # the pooler is not trained by MLM
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=16, learning_rate=3e-4,
                                 warmup_steps=0.1, max_steps=steps, logging_steps=10, save_strategy="no",
                                 report_to="none", use_cpu=True, disable_tqdm=True, seed=42,
                                 dataloader_num_workers=0)
        trainer = Trainer(model=model, args=args, train_dataset=Sentences(2000, g))
        callback = SentinelTrainerCallback.install(trainer, log_dir=log_dir)
        trainer.train()
    if progress is not None:
        progress.extend(h["loss"] for h in trainer.state.log_history if "loss" in h)
    assert callback.sentinel is not None
    return callback.sentinel.report(all_ranks=False)
