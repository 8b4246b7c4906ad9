"""A real tiny trajectory (``losslens train-tiny --tiny``), trained once per test session.

Use it from any test module::

    from tests.fixtures_trajectory import tiny_trajectory  # noqa: F401  (pytest fixture)

    def test_something(tiny_trajectory):          # a losslens.lm.checkpoints.Trajectory
        folder = tiny_trajectory.meta["folder"]   # step-000020/ step-000040/ step-000060/ trajectory.json

or call :func:`tiny_trajectory_dir` directly. The run is ``TrainConfig.tiny()`` (GPT-NeoX, hidden 32,
2 layers, vocab 512, context 32, ~58k parameters; 60 WSD steps of 8x32; checkpoints at steps 20, 40,
60) and costs ~5-10 s once per process (mostly the one-off corpus / tokenizer preparation).
Tests must treat the folder as read-only.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

_CACHE: dict[str, Path] = {}


def data_cache_dir() -> Path:
    """A per-process folder caching the tiny BPE tokenizer and token streams (shared by test runs)."""
    if "data" not in _CACHE:
        _CACHE["data"] = Path(tempfile.mkdtemp(prefix="losslens-test-data-"))
    return _CACHE["data"]


def tiny_trajectory_dir(**overrides) -> Path:
    """Folder of a finished ``TrainConfig.tiny(**overrides)`` run, trained on first use (per process)."""
    from losslens.lm.train.config import TrainConfig
    from losslens.lm.train.tiny import train_tiny

    key = repr(sorted(overrides.items()))
    if key not in _CACHE:
        out = Path(tempfile.mkdtemp(prefix="losslens-test-traj-"))
        train_tiny(TrainConfig.tiny(**overrides), out, progress=False, data_dir=data_cache_dir(), num_threads=1)
        _CACHE[key] = out
    return _CACHE[key]


@pytest.fixture(scope="session")
def tiny_trajectory():
    """``Trajectory.from_folder`` of the shared tiny run (3 checkpoints: steps 20, 40, 60)."""
    from losslens.lm.checkpoints import Trajectory

    return Trajectory.from_folder(tiny_trajectory_dir())
