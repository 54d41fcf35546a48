"""Knowledge distillation: a small student learns from a frozen teacher's temperature-softened logits.

Modelled on: the PyTorch tutorial "Knowledge Distillation"
(https://github.com/pytorch/tutorials/blob/main/beginner_source/knowledge_distillation_tutorial.py,
``train_knowledge_distillation``): the teacher in ``eval()`` under ``no_grad``, ``soft_targets =
softmax(teacher_logits / T)``, ``soft_prob = log_softmax(student_logits / T)``, ``soft_targets_loss
= sum(soft_targets * (soft_targets.log() - soft_prob)) / batch * T**2``, total ``0.25 * soft +
0.75 * CE``, T = 2, Adam at lr 1e-3. The teacher is a wider network trained first on the same
task (the tutorial trains it before distilling); the sentinel watches the student only, as a user
distilling into it would attach it.

Why it is healthy: the teacher's softened targets carry its mistakes and its uncertainty, so
the distillation term does not go to zero; the total loss falls and the student's accuracy on a
held-out set rises. The validation loss is reported every 20 steps.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import torch_sentinel

MODELLED_ON = "https://github.com/pytorch/tutorials/blob/main/beginner_source/knowledge_distillation_tutorial.py"
T, SOFT_W, CE_W, FEATURES, CLASSES, BATCH = 2.0, 0.25, 0.75, 20, 5, 64


def make_net(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, CLASSES))


def run(steps: int = 300, log_dir: Optional[str] = None,
        progress: Optional[list[float]] = None) -> torch_sentinel.Report:
    torch.manual_seed(42)
    g = torch.Generator().manual_seed(42)
    centres = 1.5 * torch.randn(CLASSES, FEATURES, generator=g)

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, CLASSES, (n,), generator=g)
        return centres[y] + 1.5 * torch.randn(n, FEATURES, generator=g), y

    ce_loss = nn.CrossEntropyLoss()
    teacher = make_net(256)
    teacher_opt = torch.optim.Adam(teacher.parameters(), lr=1e-3)
    for _ in range(200):  # the teacher is trained before distillation starts
        x, y = batch(BATCH)
        teacher_opt.zero_grad()
        ce_loss(teacher(x), y).backward()
        teacher_opt.step()
    teacher.eval()

    student = make_net(16)
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-3)
    x_val, y_val = batch(512)
    sentinel = torch_sentinel.attach(student, optimizer, log_dir=log_dir)
    student.train()
    for step in range(steps):
        inputs, labels = batch(BATCH)
        optimizer.zero_grad()
        with torch.no_grad():
            teacher_logits = teacher(inputs)
        student_logits = student(inputs)
        soft_targets = nn.functional.softmax(teacher_logits / T, dim=-1)
        soft_prob = nn.functional.log_softmax(student_logits / T, dim=-1)
        soft_targets_loss = torch.sum(soft_targets * (soft_targets.log() - soft_prob)) / soft_prob.size()[0] * (T**2)
        label_loss = ce_loss(student_logits, labels)
        loss = SOFT_W * soft_targets_loss + CE_W * label_loss
        loss.backward()
        optimizer.step()
        if progress is not None:
            progress.append(loss.item())
        if step % 20 == 19:
            student.eval()
            with torch.no_grad():
                sentinel.observe_validation(ce_loss(student(x_val), y_val))
            student.train()
    report = sentinel.report()
    sentinel.detach()
    return report
