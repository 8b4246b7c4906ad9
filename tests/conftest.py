"""Shared pytest configuration: GPU tests skip without CUDA; torch runs deterministic and small."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Sweeps run in this process unless a test asks for workers (num_workers= / --workers): monkeypatched
# probes must run where they were patched, and starting worker processes costs seconds per sweep.
os.environ["LOSSLENS_WORKERS"] = "1"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA (GPU tests run only where a GPU is present)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip_gpu)


# Tiny models on 2 cores: one intra-op thread is faster (measured 5-25x: no synchronisation on
# small matrices, no oversubscription when the other core is busy). Set once for the whole suite;
# code under test that changes it (benchmarks, the demo, training) restores it.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _allocator_settings_stay_out_of_the_test_process(monkeypatch):
    """``--strict-memory`` (implied by ``--max-memory``) changes glibc's settings for the whole
    process and the processes it starts; in-process CLI tests must not leave them on for the rest
    of the suite. The real setting is tested in subprocesses (tests/test_memory_allocator.py,
    tests/test_sweep_cli.py::test_strict_memory_changes_the_allocator_not_the_numbers)."""
    import losslens.geometry.memory.allocator as memory_allocator

    monkeypatch.setattr(memory_allocator, "return_freed_memory", lambda *args, **kwargs: True)
    yield
