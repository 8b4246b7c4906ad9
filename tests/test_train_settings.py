"""Issue #46 item 3: train-tiny's and fork's settings objects and their checks live in the library;
contradicting settings are refused there, with the option to change, before anything is trained."""

from __future__ import annotations

import pytest

from losslens.lm.train.config import TrainConfig, TrainError
from losslens.lm.train.fork_settings import ForkSettings, fork_runs
from losslens.lm.train.train_settings import TrainSettings, parse_seeds, train_runs
from losslens.study.monitor.tiny_monitor import WatchSettings, train_tiny_watched


def test_train_settings_override_the_preset_they_start_from():
    cfg = TrainSettings(tiny=True, hidden_size=48, peak_lr=1e-2).config()
    assert cfg == TrainConfig.tiny(hidden_size=48, peak_lr=1e-2)
    assert TrainSettings().config() == TrainConfig()
    assert TrainSettings(save_optimizer=True).config().save_optimizer is True
    with pytest.raises(TrainError):
        TrainSettings(schedule="zigzag").config()


def test_seed_lists_are_read_or_refused_by_name():
    assert parse_seeds("0, 2,") == [0, 2] and parse_seeds(None) is None
    with pytest.raises(TrainError, match="--seeds must be comma-separated integers"):
        parse_seeds("0,x")


def test_contradicting_train_settings_are_refused_before_training(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(TrainError, match="--monitor watches one run"):
        train_tiny_watched(out, TrainSettings(tiny=True, seeds="0,1"), WatchSettings(monitor=True))
    with pytest.raises(TrainError, match="--resume-from cannot be combined"):
        train_runs(out, TrainSettings(tiny=True, sweep=["lr=1e-3,3e-3"], resume_from=tmp_path))
    assert not out.exists()


def test_fork_settings_of_the_other_parent_kind_are_refused(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")  # a pretrained checkpoint folder, by its shape
    with pytest.raises(TrainError, match="--at, --every apply to a train-tiny parent only"):
        fork_runs(str(base), tmp_path / "out", ForkSettings(at="last", every=2, steps=4))
    with pytest.raises(TrainError, match="pass --steps N"):
        fork_runs(str(base), tmp_path / "out", ForkSettings())
    with pytest.raises(TrainError, match="--at is needed"):
        fork_runs(str(tmp_path), tmp_path / "out", ForkSettings())
    with pytest.raises(TrainError, match="one --schedule per call"):
        fork_runs(str(tmp_path), tmp_path / "out", ForkSettings(at="last", schedule="wsd,cosine"))
    assert not (tmp_path / "out").exists()
