"""seed_everything: every source seeded, independent named streams, warnings on known leaks."""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest
import torch
from helpers import MODELS, train
from torch.utils.data import DataLoader, TensorDataset

import torch_sentinel
from torch_sentinel.repro import ReproducibilityWarning


def _run(seed: int) -> list[float]:
    torch_sentinel.seed_everything(seed, warn=False)
    model = MODELS["transformer"]()  # init and dropout both draw from the global RNG
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_sentinel.attach(model, opt, seed=seed):
        return train(model, opt, "transformer", steps=3)


def test_two_seeded_runs_produce_identical_losses() -> None:
    a, b, c = _run(7), _run(7), _run(8)
    assert a == b
    assert a != c


def test_every_library_is_seeded() -> None:
    torch_sentinel.seed_everything(3, warn=False)
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    torch_sentinel.seed_everything(3, warn=False)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


def test_named_streams_are_stable_and_independent() -> None:
    s1 = torch_sentinel.seed_everything(42, warn=False)
    data_first = s1.numpy("data").normal(size=4)
    s2 = torch_sentinel.seed_everything(42, warn=False)
    s2.numpy("augmentation").normal(size=100)  # drawing from another stream first changes nothing
    assert np.array_equal(s2.numpy("data").normal(size=4), data_first)
    assert not np.array_equal(s2.numpy("augmentation").normal(size=4), data_first)
    assert torch.equal(s1.torch("data").initial_seed() * torch.ones(1), s2.torch("data").initial_seed() * torch.ones(1))
    children = s1.spawn(2)
    expected = np.random.SeedSequence(42).spawn(2)
    assert [c.generate_state(2).tolist() for c in children] == [c.generate_state(2).tolist() for c in expected]


def test_warns_about_nondeterministic_algorithms_and_cudnn_benchmark() -> None:
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        with pytest.warns(ReproducibilityWarning) as record:
            torch_sentinel.seed_everything(0)
    finally:
        torch.backends.cudnn.benchmark = previous
    texts = [str(w.message) for w in record]
    assert any("torch.use_deterministic_algorithms is off" in t for t in texts)
    assert any("cudnn.benchmark is on" in t for t in texts)


def test_deterministic_true_switches_determinism_on_and_stays_quiet() -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", ReproducibilityWarning)
            torch_sentinel.seed_everything(0, deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False


def test_warns_about_dataloader_workers_without_seeding() -> None:
    ds = TensorDataset(torch.arange(8.0))
    bare = DataLoader(ds, batch_size=2, shuffle=True, num_workers=2)
    seeds = torch_sentinel.seed_everything(0, warn=False)
    seeded = DataLoader(ds, batch_size=2, shuffle=True, num_workers=2, **seeds.dataloader_kwargs())
    with pytest.warns(ReproducibilityWarning) as record:
        torch_sentinel.seed_everything(0, loaders=[bare, seeded])
    texts = [str(w.message) for w in record]
    assert any("DataLoader 0 has num_workers=2 and no worker_init_fn" in t for t in texts)
    assert any("DataLoader 0 shuffles without a generator" in t for t in texts)
    assert not any("DataLoader 1" in t for t in texts)


@pytest.mark.parametrize(("seed", "error"), [(1.5, TypeError), (True, TypeError), (-1, ValueError)],
                         ids=["float", "bool", "negative"])
def test_bad_seed(seed: object, error: type) -> None:
    with pytest.raises(error, match="seed"):
        torch_sentinel.seed_everything(seed)  # type: ignore[arg-type]
