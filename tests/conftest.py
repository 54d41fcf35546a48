"""Shared fixtures. Model classes and the plain training loop live in tests/helpers.py."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

# Tests choose their policy and mode explicitly; an override in the environment would change them.
for _var in ("TORCH_SENTINEL_ON_NONFINITE", "TORCH_SENTINEL_CHECK"):
    os.environ.pop(_var, None)


@pytest.fixture(params=["mlp", "cnn", "transformer"], ids=["mlp", "cnn", "transformer"])
def model_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=["immediate", "deferred"], ids=["immediate", "deferred"])
def check_mode(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(autouse=True)
def _torch_threads_restored() -> Iterator[None]:
    """No test leaves torch's intra-op thread count changed for the tests after it (the
    benchmarks' entry points set it, as a command line should): a test that depends on the
    count sets it itself, and passes or fails the same alone and in the suite."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture
def one_torch_thread():
    """Tiny example programs on 2 shared cores: intra-op threads only thrash."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


#: Whole corpora, spawned process groups, compilation and benchmark smoke runs: the full suite
#: runs them (CI does); `pytest -m "not slow"` leaves them out for a quick round.
_SLOW_PATHS = ("healthy/", "realbugs/", "realworld/", "losses/", "distributed/", "replicas/",
               "compile/", "benchmarks/", "integrations/", "test_healthy_corpus.py")
#: Single tests that take seconds (fresh interpreters, long loops), measured with --durations.
_SLOW_TESTS = frozenset({
    "lifecycle/test_state_plain.py::test_resumed_run_reports_exactly_what_the_uninterrupted_run_reports",
    "lifecycle/test_state_plain.py::test_state_dict_is_plain_data_and_loads_with_weights_only",
    "lifecycle/test_exit.py::test_uncaught_nonfinite_error_leaves_every_row_up_to_the_bad_step",
    "lifecycle/test_exit.py::test_kill_9_leaves_files_readable_up_to_the_last_flush",
    "lifecycle/test_exit.py::test_readme_first_example_verbatim_loses_no_step",
    "lifecycle/test_copies.py::test_a_saved_model_loads_and_trains_where_torch_sentinel_cannot_be_imported",
    "lifecycle/test_copies.py::test_a_copy_keeps_the_users_hooks_and_nothing_of_ours",
    "lifecycle/test_resume.py::test_resumed_run_reports_what_the_uninterrupted_run_reports",
    "lifecycle/test_leaks.py::test_a_kept_sentinel_does_not_keep_a_dropped_model",
    "detectors/test_no_update.py::test_no_update_in_other_dtypes",
    "detectors/test_no_update.py::test_scale_invariant_weight_before_a_norm_layer",
    "detectors/test_saturation.py::test_deep_stack_saturation_is_what_plain_torch_measures",
    "detectors/test_nonfinite.py::test_cnn_and_transformer_models_are_quiet_in_both_modes",
    "cli/test_broken_pipe.py::test_every_subcommand_into_a_reader_already_gone",
    "cli/test_broken_pipe.py::test_report_into_a_reader_that_reads_one_line",
    "collect/test_collector.py::test_memory_stays_flat_over_two_thousand_steps",
    "precision/test_hot_path.py::test_ordinary_steps_launch_nothing_more",
    "precision/test_healthy.py::test_realworld_healthy_runs_are_quiet",
    "precision/test_compile.py::test_compiled_rows_match_eager_ones_and_the_graph_holds",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = item.nodeid.split("::")[0].removeprefix("tests/")
        test = f"{path}::{item.nodeid.split('::')[-1].split('[')[0]}"
        if path.startswith(_SLOW_PATHS) or test in _SLOW_TESTS or item.get_closest_marker("inductor"):
            item.add_marker(pytest.mark.slow)
