"""A dataset class slices its attribute labels to the requested split with a mask but keeps the
file list of every split unmasked, so ``__getitem__(i)`` returns the i-th image of the whole set
with the i-th label of the split: images and labels no longer belong together, and the model can
learn nothing but the label frequencies (the loss sits at chance level). No error. The fix: mask
the file list with the same split mask.

Source: pytorch/vision#4209 "CelebA dataset generates mismatched data and labels" ("without
indexing with mask, self.filename consists of all samples from train/test/valid sets. However,
all the other meta-labels are sliced with indexes mask"), https://github.com/pytorch/vision/issues/4209 .
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import torch_sentinel

SOURCE = "https://github.com/pytorch/vision/issues/4209"
CLASS = "inputs and labels misaligned in the dataset"
KIND, MODULE, CAUSE, ONSET = "plateau", None, None, 0


class FaceAttributes(torch.utils.data.Dataset):
    def __init__(self, images: torch.Tensor, attrs: torch.Tensor, split: torch.Tensor, bug: bool) -> None:
        mask = split == 0  # the train split
        self.images = images if bug else images[mask]  # the bug: the file list is not masked
        self.attrs = attrs[mask]

    def __len__(self) -> int:
        return len(self.attrs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[i], self.attrs[i]


def run(bug: bool, watch: Callable[[Any], None]) -> torch_sentinel.Report:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    images = torch.randn(3000, 24, generator=g)
    attrs = (images[:, 0] + images[:, 1] > 0).float()  # e.g. "Smiling", visible in the image
    split = torch.randint(0, 3, (3000,), generator=g)  # train / valid / test, interleaved
    loader = torch.utils.data.DataLoader(FaceAttributes(images, attrs, split, bug), batch_size=32, shuffle=True,
                                         generator=torch.Generator().manual_seed(2))
    model = nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with torch_sentinel.attach(model, opt) as s:
        for _epoch in range(2):  # 2 x 32 batches
            for x, y in loader:
                opt.zero_grad()
                nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(1), y).backward()
                opt.step()
                watch(s)
        return s.report()
