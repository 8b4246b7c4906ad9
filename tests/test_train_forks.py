"""Schedule forks: exact resumption from the parent checkpoint, lineage, fork schedules as recorded,
reruns, compare_forks (cool phases, wins per seed pair) and the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from losslens.lm.checkpoints import Trajectory
from losslens.lm.train import schedules as S
from losslens.lm.train.config import TrainError
from losslens.lm.train.fork_compare import compare_forks, find_forks, fork_wins, wins_summary
from losslens.lm.train.fork_schedule import ForkSchedule, lr_function
from losslens.lm.train.forks import fork_trajectory
from tests.fixtures_trajectory import data_cache_dir, tiny_trajectory_dir

PARENT = dict(steps=24, checkpoints=3, save_optimizer=True)  # checkpoints at steps 8, 16, 24 (with AdamW state)
KW = dict(progress=False, data_dir=None, num_threads=1)


def _parent() -> Path:
    return tiny_trajectory_dir(**PARENT)


def _weights(folder) -> dict:
    return load_file(str(Path(folder) / "model.safetensors"))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def forks(tmp_path_factory):
    """cosine and oscillate forks of step 8 (10 updates, 2 seeds each), checkpoints every 2 updates."""
    out = tmp_path_factory.mktemp("forks")
    kw = dict(KW, data_dir=data_cache_dir())
    cos = fork_trajectory(_parent(), "step-000008", ForkSchedule("cosine", steps=10), out, seeds=[0, 1], every=2, **kw)
    osc = fork_trajectory(
        _parent(),
        8,
        ForkSchedule("oscillate", steps=10, amplitude=2e-3, bump_steps=2, cool_steps=3),
        out,
        seeds=[0, 1],
        every=2,
        **kw,
    )
    return out, cos, osc


def test_fork_resumes_exactly_and_records_lineage(tmp_path):
    parent = Trajectory.from_folder(_parent())
    # the parent's own schedule with the parent's data seed: must reproduce its next checkpoint bit for bit
    (fork,) = fork_trajectory(
        parent,
        "step-000008",
        ForkSchedule("parent", steps=8),
        tmp_path,
        seeds=[0],
        checkpoints=1,
        **dict(KW, data_dir=data_cache_dir()),
    )
    assert fork.steps == [8, 16] and fork.name == "parent-at8-n8-s0"
    start, end = fork[0], fork[-1]
    assert _same(_weights(start.location), _weights(parent["step-000008"].location))  # fork step 0 == parent ckpt
    assert start.meta["val_loss"] == parent["step-000008"].meta["val_loss"]  # same loss at fork step 0
    assert _same(_weights(end.location), _weights(parent["step-000016"].location))  # bit-exact continuation
    assert end.meta["val_loss"] == parent["step-000016"].meta["val_loss"] and end.lr == parent["step-000016"].lr

    f = fork.meta["fork"]  # lineage
    assert f["parent"] == str(Path(parent.meta["folder"]).resolve()) and f["parent_name"] == parent.name
    assert (f["parent_checkpoint"], f["parent_step"], f["seed"]) == ("step-000008", 8, 0)
    assert f["parent_lr"] == parent["step-000008"].lr and f["start_loss_matches"] is True
    assert f["schedule"]["kind"] == "parent" and "restored" in f["optimizer_state"]
    assert start.meta["phase"] == "start" and start.meta["fork_start"] is True
    assert fork.meta["data"]["validation_hash"] == parent.meta["data"]["validation_hash"]
    assert json.loads((tmp_path / "forks.json").read_text())["forks"][0]["path"] == "parent-at8-n8-s0"


def test_fork_without_optimizer_state_is_refused_or_documented(tmp_path):
    parent = tmp_path / "parent"
    shutil.copytree(_parent(), parent, ignore=shutil.ignore_patterns("data"))
    (parent / "step-000016" / "training_state.pt").unlink()
    sched = ForkSchedule("cosine", steps=2)
    with pytest.raises(TrainError, match="training_state.pt"):
        fork_trajectory(parent, "step-000016", sched, tmp_path / "f", **dict(KW, data_dir=data_cache_dir()))
    (fork,) = fork_trajectory(
        parent,
        "step-000016",
        sched,
        tmp_path / "f",
        restart_moments=True,
        checkpoints=1,
        **dict(KW, data_dir=data_cache_dir()),
    )
    f = fork.meta["fork"]
    assert "restarted" in f["optimizer_state"] and f["start_loss_matches"] is True
    assert any("restarted" in n for n in fork.meta["notes"])
    with pytest.raises(TrainError, match="no checkpoint"):
        fork_trajectory(parent, "step-000011", sched, tmp_path / "g", **dict(KW, data_dir=data_cache_dir()))


def test_fork_schedules_seeds_and_rerun(forks):
    out, cos, osc = forks
    assert [t.name for t in cos + osc] == [
        "cosine-at8-n10-s0",
        "cosine-at8-n10-s1",
        "oscillate-a2e-3-b2-c3-at8-n10-s0",
        "oscillate-a2e-3-b2-c3-at8-n10-s1",
    ]
    plr = Trajectory.from_folder(_parent())["step-000008"].lr
    for t in cos + osc:
        assert t.steps == [8, 10, 12, 14, 16, 18]
        fn = lr_function(t.meta)
        sched = ForkSchedule.from_dict(t.meta["fork"]["schedule"])
        for ref in t.real[1:]:
            assert ref.lr == pytest.approx(fn(ref.step)) == pytest.approx(sched.lr(ref.step - 8))
    # cosine continuation from the parent's LR at step 8 to its final LR (0) over 10 updates
    assert [r.lr for r in cos[0].real[1:]] == pytest.approx(
        [S.cosine_continuation_lr(t, 10, plr, 0.0) for t in (2, 4, 6, 8, 10)]
    )
    # oscillate: bumps at updates 1-2 and 6-7, cool at 3-5 and 8-10 -> checkpoints t=2, 6 are bumps
    assert [r.meta["phase"] for r in osc[0]] == ["start", "bump", "cool", "bump", "cool", "cool"]
    assert osc[0]["step-000010"].lr == pytest.approx(S.cosine_continuation_lr(2, 10, plr, 0.0) + 2e-3)
    # seeds change the data order only: same start, different ends
    assert _same(_weights(cos[0][0].location), _weights(cos[1][0].location))
    assert not _same(_weights(cos[0][-1].location), _weights(cos[1][-1].location))
    assert {(e["condition"], e["seed"]) for e in json.loads((out / "forks.json").read_text())["forks"]} == {
        ("cosine-at8-n10", 0),
        ("cosine-at8-n10", 1),
        ("oscillate-a2e-3-b2-c3-at8-n10", 0),
        ("oscillate-a2e-3-b2-c3-at8-n10", 1),
    }
    # rerun: finished forks are returned untouched; a different fork into the same folder is refused
    tj = out / "cosine-at8-n10-s0" / "trajectory.json"
    mtime = tj.stat().st_mtime_ns
    again = fork_trajectory(
        _parent(),
        "step-000008",
        ForkSchedule("cosine", steps=10),
        out,
        seeds=[0],
        every=2,
        **dict(KW, data_dir=data_cache_dir()),
    )
    assert again[0].labels == cos[0].labels and tj.stat().st_mtime_ns == mtime
    with pytest.raises(TrainError, match="different run"):
        fork_trajectory(
            _parent(),
            8,
            ForkSchedule("cosine", steps=10),
            out,
            seeds=[0],
            every=5,
            **dict(KW, data_dir=data_cache_dir()),
        )


def test_compare_forks_wins_per_seed_pair(forks):
    out, cos, osc = forks
    df = compare_forks([out], spec="rtn:3:row", quick=True)
    assert set(df["condition"]) == {"cosine-at8-n10", "oscillate-a2e-3-b2-c3-at8-n10"}
    assert (df["phase"] != "bump").all()  # cool phases only
    assert sorted(df[df["condition"].str.startswith("osc") & (df["seed"] == 0)]["t"]) == [0, 4, 8, 10]
    assert sorted(df[df["condition"].str.startswith("cos") & (df["seed"] == 1)]["t"]) == [0, 2, 4, 6, 8, 10]
    start = df[df["fork_start"]]
    assert len(start) == 4 and start["gap"].nunique() == 1  # the shared fork point, measured once
    assert list(df["gap"]) == pytest.approx(list(np.expm1(df["q_loss"] - df["fp_loss"])))
    assert ((df["fp_loss"] - df["val_loss"]).abs() < 1.0).all() and (df["q_loss"] > 0).all()
    wins = df.attrs["wins"]
    assert list(wins["seed_a"]) == [0, 1] and (wins["seed_a"] == wins["seed_b"]).all()
    final = df[df["t"] == 10].set_index(["condition", "seed"])["gap"]
    for _, w in wins.iterrows():
        ga, gb = final[(w["condition_a"], w["seed_a"])], final[(w["condition_b"], w["seed_b"])]
        assert (w["gap_a"], w["gap_b"]) == (ga, gb) and w["winner"] == ("a" if ga < gb else "b" if gb < ga else "tie")
    summ = df.attrs["summary"]
    assert (
        len(summ) == 1
        and summ.loc[0, "n"] == 2
        and summ.loc[0, "a_wins"] + summ.loc[0, "b_wins"] + summ.loc[0, "ties"] == 2
    )
    every = compare_forks([out / "oscillate-a2e-3-b2-c3-at8-n10-s0"], cool_only=False, quick=True)
    assert list(every["phase"]) == ["start", "bump", "cool", "bump", "cool", "cool"] and every.attrs["wins"].empty


def test_fork_wins_pairings():
    rows = [
        {"condition": c, "seed": s, "step": 10, "gap": g, "fork_start": False}
        for c, gaps in [("A", [0.1, 0.2, 0.3]), ("B", [0.15, 0.15, 0.15])]
        for s, g in enumerate(gaps)
    ]
    df = pd.DataFrame(rows)
    by_seed = fork_wins(df)
    assert list(by_seed["winner"]) == ["a", "b", "b"]
    every = wins_summary(fork_wins(df, pairing="all"))
    assert every.loc[0, "n"] == 9 and every.loc[0, "a_wins"] == 3 and every.loc[0, "b_wins"] == 6
    with pytest.raises(TrainError):
        fork_wins(df, pairing="pairs")


def test_cli_fork_and_compare(forks, tmp_path):
    from typer.testing import CliRunner

    from losslens.cli.app import app

    out, cos, _ = forks
    res = CliRunner().invoke(
        app,
        [
            "fork",
            str(_parent()),
            "--at",
            "step-000008",
            "--schedule",
            "sgdr",
            "--steps",
            "4",
            "--period",
            "2",
            "--restart-lr",
            "3e-3",
            "--seeds",
            "0,1",
            "--checkpoints",
            "2",
            "--out",
            str(tmp_path),
            "--data-dir",
            str(data_cache_dir()),
            "--threads",
            "1",
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "sgdr-p2-r3e-3-at8-n4-s1: 3 checkpoints" in res.output and "same as parent" in res.output
    assert [p.name for p in find_forks([tmp_path])] == ["sgdr-p2-r3e-3-at8-n4-s0", "sgdr-p2-r3e-3-at8-n4-s1"]
    sg = Trajectory.from_folder(tmp_path / "sgdr-p2-r3e-3-at8-n4-s0")
    assert [r.lr for r in sg.real[1:]] == pytest.approx([S.sgdr_lr(2, 2, 3e-3), S.sgdr_lr(4, 2, 3e-3)])
    csv = tmp_path / "gaps.csv"
    res = CliRunner().invoke(
        app,
        [
            "compare-forks",
            str(tmp_path),
            str(out / "cosine-at8-n10-s0"),
            "--quick",
            "--csv",
            str(csv),
            "--threads",
            "1",
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "wins per seed pair" in res.output and "sgdr-p2-r3e-3-at8-n4 vs cosine-at8-n10: " in res.output
    assert len(pd.read_csv(csv)) == 3 + 3 + 6
    bad = CliRunner().invoke(
        app, ["fork", str(_parent()), "--at", "step-000008", "--schedule", "zigzag", "--out", str(tmp_path / "z")]
    )
    assert bad.exit_code != 0 and "zigzag" in bad.output
