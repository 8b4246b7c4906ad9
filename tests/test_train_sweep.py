"""Sweeps: `train-tiny --sweep lr=... --sweep wd=... --seeds ...` -> one readable folder per run,
sweep.json, finished runs skipped on rerun, failures recorded."""

from __future__ import annotations

import json

import pytest

import losslens.lm.train.grid as tt
from losslens.lm.checkpoints import Trajectory
from losslens.lm.train.config import TrainConfig, TrainError, format_value
from losslens.lm.train.grid import parse_sweep, plan_sweep, sweep_run_name, train_sweep
from tests.fixtures_trajectory import data_cache_dir


def test_format_value_and_parse_sweep():
    assert [format_value(v) for v in (3e-3, 1e-2, 2.5e-3, 0.5, 0.1, 1.0, 600, True, "cosine")] == [
        "3e-3",
        "1e-2",
        "2.5e-3",
        "0.5",
        "0.1",
        "1",
        "600",
        "true",
        "cosine",
    ]
    grid = parse_sweep(["lr=1e-3,3e-3,1e-2", "wd=0.1,0.5", "schedule=wsd,cosine", "hidden=32"])
    assert grid == {
        "peak_lr": [1e-3, 3e-3, 1e-2],
        "weight_decay": [0.1, 0.5],
        "schedule": ["wsd", "cosine"],
        "hidden_size": [32],
    }
    assert parse_sweep(["data_seed=none,3", "save_optimizer=true"]) == {
        "data_seed": [None, 3],
        "save_optimizer": [True],
    }
    for bad, msg in [
        ("lr", "KEY=V1"),
        ("colour=red", "cannot sweep"),
        ("seed=0,1", "--seeds"),
        ("lr=fast", "not of type float"),
        ("steps=1.5", "not of type int"),
        ("lr=1e-3,0.001", "repeats"),
    ]:
        with pytest.raises(TrainError, match=msg):
            parse_sweep([bad])


def test_plan_names():
    configs = plan_sweep(TrainConfig.tiny(), {"lr": [1e-3, 3e-3], "wd": ["0.1", "0.5"]}, seeds=[0, 1])
    names = [c.name for c in configs]
    assert names[:3] == ["wsd-lr1e-3-wd0.1-s0", "wsd-lr1e-3-wd0.1-s1", "wsd-lr1e-3-wd0.5-s0"]
    assert len(set(names)) == 8 and names[-1] == "wsd-lr3e-3-wd0.5-s1"
    c = configs[-1]
    assert (c.peak_lr, c.weight_decay, c.seed, c.run_name) == (3e-3, 0.5, 1, names[-1])
    cfg = TrainConfig.tiny(schedule="cosine", peak_lr=1e-2, seed=2)
    assert sweep_run_name(cfg, ["schedule", "peak_lr"]) == "cosine-lr1e-2-s2"
    with pytest.raises(TrainError, match="distinct"):
        plan_sweep(TrainConfig.tiny(), {}, seeds=[0, 0])


def test_train_sweep_skips_finished_runs_and_records_failures(tmp_path, monkeypatch):
    base = TrainConfig.tiny(steps=4, checkpoints=1)
    kw = dict(progress=False, data_dir=data_cache_dir(), num_threads=1)
    trajs = train_sweep(base, {"lr": [1e-3, 3e-3]}, tmp_path, seeds=[0], **kw)
    assert [t.name for t in trajs] == ["wsd-lr1e-3-s0", "wsd-lr3e-3-s0"]
    index = json.loads((tmp_path / "sweep.json").read_text())
    assert [r["status"] for r in index["runs"]] == ["done", "done"]
    assert index["grid"] == {"peak_lr": [1e-3, 3e-3]} and index["runs"][1]["params"] == {"peak_lr": 3e-3}
    assert Trajectory.from_folder(tmp_path / "wsd-lr3e-3-s0").meta["config"]["peak_lr"] == 3e-3
    mtime = (tmp_path / "wsd-lr1e-3-s0" / "trajectory.json").stat().st_mtime_ns

    # rerun with one more value: the two finished runs are skipped, the new one trains
    real = tt.train_tiny
    calls = []

    def spy(config, out_dir, **kwargs):
        calls.append(config.name)
        if config.peak_lr == 1e-2:
            raise TrainError("training diverged at step 3 (loss nan)")
        return real(config, out_dir, **kwargs)

    monkeypatch.setattr(tt, "train_tiny", spy)
    seen = []
    trajs = train_sweep(base, {"lr": [1e-3, 3e-3, 1e-2]}, tmp_path, seeds=[0], on_run=seen.append, **kw)
    assert calls == ["wsd-lr1e-2-s0"] and len(trajs) == 2
    assert (tmp_path / "wsd-lr1e-3-s0" / "trajectory.json").stat().st_mtime_ns == mtime
    runs = json.loads((tmp_path / "sweep.json").read_text())["runs"]
    assert [r["status"] for r in runs] == ["cached", "cached", "failed"] == [e["status"] for e in seen]
    assert "diverged" in runs[2]["error"] and runs[0]["final_val_loss"] == trajs[0][-1].meta["val_loss"]
    # a changed base config must not silently reuse or clobber the old folders
    with pytest.raises(TrainError, match="different config"):
        train_sweep(TrainConfig.tiny(steps=5, checkpoints=1), {"lr": [1e-3]}, tmp_path, seeds=[0], **kw)


def test_cli_sweep(tmp_path):
    from typer.testing import CliRunner

    from losslens.cli.app import app

    args = [
        "train-tiny",
        "--out",
        str(tmp_path),
        "--tiny",
        "--steps",
        "3",
        "--checkpoints",
        "1",
        "--sweep",
        "wd=0.1,0.5",
        "--seeds",
        "0,1",
        "--data-dir",
        str(data_cache_dir()),
        "--threads",
        "1",
        "-q",
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    names = ["wsd-wd0.1-s0", "wsd-wd0.1-s1", "wsd-wd0.5-s0", "wsd-wd0.5-s1"]
    assert all(f"{n}: done" in res.output for n in names) and "4 of 4 runs finished" in res.output
    assert sorted(p.name for p in tmp_path.iterdir() if (p / "trajectory.json").is_file()) == names
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and again.output.count(": cached") == 4
    bad = CliRunner().invoke(app, ["train-tiny", "--out", str(tmp_path / "x"), "--tiny", "--sweep", "lr"])
    assert bad.exit_code != 0 and "KEY=V1" in bad.output
