"""Fine-tuning a (tiny, config-built) BERT classifier with a plain PyTorch loop, the way the
Hugging Face "no trainer" examples do.

Modelled on: huggingface/transformers ``examples/pytorch/text-classification/
run_glue_no_trainer.py`` (``no_decay = ["bias", "LayerNorm.weight"]`` parameter groups,
``torch.optim.AdamW``, ``get_scheduler("linear", num_warmup_steps=...)``, ``model.train()`` at
the start of each epoch, ``outputs = model(**batch); loss = outputs.loss; loss.backward();
optimizer.step(); lr_scheduler.step(); optimizer.zero_grad()``). The model is built from a
``BertConfig`` (no hub download) and, like ``from_pretrained``, handed over in eval mode.

Data: token sequences; the label says which half of the vocabulary they were drawn from.
"""

from __future__ import annotations

from typing import Optional

import torch
from realworld.harness import Bug

import torch_sentinel

MODELLED_ON = "huggingface/transformers examples/pytorch/text-classification/run_glue_no_trainer.py"
LR = 3e-3
HEALTHY_XFAIL: Optional[str] = None
BUGS = {
    "no_model_train": Bug("model.train() missing (the model stays in eval mode as loaded)",
                          "eval_mode_training", module=""),
    "optimizer_over_frozen_encoder": Bug(
        "AdamW(model.bert.parameters()) after freezing model.bert (meant: model.classifier)",
        "unregistered_parameter", module="classifier"),
}


def make_model(seed: int):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=16, num_labels=2)
    model = BertForSequenceClassification(config)
    model.eval()  # from_pretrained() returns the model in eval mode
    return model


def make_batch(n: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    labels = torch.randint(0, 2, (n,), generator=g)
    ids = torch.randint(6, 19, (n, 12), generator=g) + 13 * labels[:, None]
    ids[:, 0] = 2  # [CLS]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def run(bug: Optional[str] = None, log_dir: Optional[str] = None) -> list[float]:
    from transformers import get_scheduler

    g = torch.Generator().manual_seed(1)
    model = make_model(0)
    if bug == "optimizer_over_frozen_encoder":
        for param in model.bert.parameters():
            param.requires_grad = False
        optimizer = torch.optim.AdamW(model.bert.parameters(), lr=LR)
    else:
        no_decay = ["bias", "LayerNorm.weight"]
        groups = [
            {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
             "weight_decay": 0.01},
            {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
             "weight_decay": 0.0},
        ]
        optimizer = torch.optim.AdamW(groups, lr=LR)
    epochs, steps_per_epoch = 2, 20
    lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=4,
                                 num_training_steps=epochs * steps_per_epoch)
    losses: list[float] = []
    with torch_sentinel.attach(model, optimizer, log_dir=log_dir):
        for _epoch in range(epochs):
            if bug != "no_model_train":
                model.train()
            for _step in range(steps_per_epoch):
                outputs = model(**make_batch(16, g))
                loss = outputs.loss
                loss.backward()
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
                losses.append(loss.item())
    return losses
