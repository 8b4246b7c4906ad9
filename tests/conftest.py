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
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


# Tiny models on 2 cores: one intra-op thread is faster (measured 5-25x: no synchronisation on
# small matrices, no oversubscription when the other core is busy). Set once for the whole suite;
# code under test that changes it (benchmarks, the demo, training) restores it.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(0)
    yield
