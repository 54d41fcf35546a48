"""Loss cases inside frameworks: an HF model's ``labels=`` path and a Lightning ``training_step``.

- HF: a GPT-2 language model (causal LM loss: ``nn.functional.cross_entropy`` over the flattened
  vocabulary, -100 padding) and a BERT sequence classifier with
  ``problem_type="multi_label_classification"`` (``BCEWithLogitsLoss`` on the labels), both
  built from tiny configs, trained in a plain loop with the one-line attach. The misuse: multi-label
  attributes stored as {-1, 1}, as CelebA's annotation files have them.
- Lightning: a classifier whose ``training_step`` calls ``F.nll_loss``, with
  ``SentinelCallback`` (Lightning's one line); the misuse: ``nll_loss`` on the raw logits.
"""

from __future__ import annotations

import dataclasses
import tempfile
import warnings
from typing import Any, Callable, Optional

import pytest
import torch
from losses.harness import STEPS, Outcome
from losses.tasks import CLASSES, classify, mlp
from torch.nn import functional as F

import torch_sentinel


@dataclasses.dataclass(frozen=True)
class FrameworkCase:
    name: str
    loss: str
    run: Callable[[], Outcome]
    why: str
    expect: Optional[tuple[str, str]] = None
    form: str = "hf"
    raises: Optional[type[BaseException]] = None


def _loop(model: torch.nn.Module, loss_at: Callable[[torch.Generator], torch.Tensor], steps: int = STEPS) -> Outcome:
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    g = torch.Generator().manual_seed(0)
    sentinel = torch_sentinel.attach(model, opt)  # the one line
    error: Optional[BaseException] = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(steps):
                opt.zero_grad()
                loss_at(g).backward()
                opt.step()
    except Exception as exc:
        error = exc
    findings = sentinel.report().findings
    sentinel.detach()
    return Outcome(list(findings), error)


def hf_gpt2_labels() -> Outcome:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    model = transformers.GPT2LMHeadModel(cfg)

    def loss_at(g: torch.Generator) -> torch.Tensor:
        start = torch.randint(0, 50, (4, 1), generator=g)
        ids = (start + torch.arange(10)) % 50  # counting sequences: learnable
        labels = ids.clone()
        labels[:, -2:] = -100  # padding, as a collator marks it
        return model(input_ids=ids, labels=labels).loss

    return _loop(model, loss_at)


def _bert(labels_of: Callable[[torch.Tensor], torch.Tensor]) -> Outcome:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=16, num_labels=CLASSES,
                                  problem_type="multi_label_classification")
    model = transformers.BertForSequenceClassification(cfg)
    w = torch.randn(50, CLASSES, generator=torch.Generator().manual_seed(7))

    def loss_at(g: torch.Generator) -> torch.Tensor:
        ids = torch.randint(0, 50, (8, 10), generator=g)
        multi_hot = (w[ids].mean(1) > 0).float()
        return model(input_ids=ids, labels=labels_of(multi_hot)).loss

    return _loop(model, loss_at)


def hf_bert_multilabel() -> Outcome:
    return _bert(lambda y: y)


def hf_bert_multilabel_pm1() -> Outcome:
    return _bert(lambda y: y * 2 - 1)  # BUG: attributes as {-1, 1}


def _lightning(log_softmax: bool) -> Outcome:
    pl = pytest.importorskip("lightning.pytorch")
    from torch_sentinel.integrations.lightning import SentinelCallback

    class Classifier(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp(8, CLASSES)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            out = self(x)
            return F.nll_loss(F.log_softmax(out, dim=1) if log_softmax else out, y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x, y = classify(g, 16 * STEPS)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    callback = SentinelCallback()
    error: Optional[BaseException] = None
    with warnings.catch_warnings(), tempfile.TemporaryDirectory() as root:
        warnings.simplefilter("ignore")
        # the callback writes its TensorBoard files under the Trainer's root: not the working dir
        trainer = pl.Trainer(max_steps=STEPS, callbacks=[callback], logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                             num_sanity_val_steps=0, default_root_dir=root)
        try:
            trainer.fit(Classifier(), train_dataloaders=data)
        except Exception as exc:
            error = exc
    sentinel = callback.sentinel
    findings = list(sentinel.report().findings) if sentinel is not None else []
    return Outcome(findings, error)


FRAMEWORK_CASES: list[FrameworkCase] = [
    FrameworkCase("hf-gpt2-labels", "cross_entropy", hf_gpt2_labels, "causal LM labels= with -100 padding"),
    FrameworkCase("hf-bert-multilabel", "binary_cross_entropy_with_logits", hf_bert_multilabel,
                  "multi-label labels= in {0, 1}"),
    FrameworkCase("hf-bert-multilabel-pm1", "binary_cross_entropy_with_logits", hf_bert_multilabel_pm1,
                  "multi-label labels= in {-1, 1}", expect=("invalid_target", "target_range")),
    FrameworkCase("lightning-nll-log-softmax", "nll_loss", lambda: _lightning(True),
                  "training_step: log_softmax then nll_loss", form="lightning"),
    FrameworkCase("lightning-nll-on-logits", "nll_loss", lambda: _lightning(False),
                  "training_step: nll_loss on logits", expect=("invalid_loss_input", "log_probabilities"),
                  form="lightning"),
]
