"""The embedded trajectory: schedules, determinism, resume, CLI, and the round trip
train-tiny -> Trajectory.from_folder -> CheckpointLoader -> evaluate == trajectory.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from losslens.lm.checkpoints import CheckpointLoader, Trajectory
from losslens.lm.data import default_token_sets, load_tokenizer, tokenizer_fingerprint
from losslens.lm.core.next_token_loss import evaluate
from losslens.lm.core.tokenset import TokenSetError
from losslens.lm.train.config import TrainConfig, TrainError, lr_at
from losslens.lm.train.tiny import train_tiny
from tests.fixtures_trajectory import data_cache_dir, tiny_trajectory  # noqa: F401


def _train(out: Path, **overrides) -> Trajectory:
    return train_tiny(TrainConfig.tiny(**overrides), out, progress=False, data_dir=data_cache_dir(), num_threads=1)


def _weights(folder: Path) -> dict:
    return load_file(str(folder / "model.safetensors"))


@pytest.mark.parametrize("schedule", ["wsd", "cosine", "constant", "linear"])
def test_lr_schedules(schedule):
    cfg = TrainConfig(schedule=schedule, peak_lr=1e-2, steps=100, warmup=0.1, decay=0.2, min_lr_ratio=0.1)
    lrs = [lr_at(s, cfg) for s in range(1, 101)]
    assert lrs[0] == pytest.approx(1e-3) and lrs[9] == pytest.approx(1e-2)  # linear warmup over 10 steps
    assert max(lrs) == pytest.approx(1e-2) and min(lrs) > 0
    if schedule == "constant":
        assert lrs[-1] == pytest.approx(1e-2)
    else:
        assert lrs[-1] == pytest.approx(1e-3)
    if schedule == "wsd":
        assert lrs[79] == pytest.approx(1e-2) and lrs[80] < 1e-2  # stable until step 80, then linear decay
        assert lr_at(90, cfg) == pytest.approx(1e-2 + (1e-3 - 1e-2) * 0.5)
    if schedule == "cosine":
        assert lr_at(55, cfg) == pytest.approx(1e-3 + 0.9e-2 * 0.5)  # half way through the decay
    assert all(b <= a + 1e-15 for a, b in zip(lrs[9:], lrs[10:]))  # non-increasing after warmup


def test_bad_config():
    with pytest.raises(TrainError, match="schedule"):
        TrainConfig(schedule="step")
    with pytest.raises(TrainError, match="checkpoints"):
        TrainConfig(steps=5, checkpoints=6)
    assert TrainConfig(steps=100, checkpoints=4).checkpoint_steps == [25, 50, 75, 100]


def test_round_trip_loss_matches_trajectory_json(tiny_trajectory):
    traj = tiny_trajectory
    folder = Path(traj.meta["folder"])
    record = json.loads((folder / "trajectory.json").read_text())
    assert traj.steps == [20, 40, 60] and record["complete"]
    cfg = TrainConfig.from_dict(record["config"])
    val = traj.validation_set
    assert tuple(val.tokens.shape) == (cfg.val_batches, cfg.batch_size, cfg.seq_len)
    assert val.content_hash == record["data"]["validation_hash"] and val.meta["split"] == "heldout"
    loader = CheckpointLoader(traj)
    for ref, rec in zip(traj, record["checkpoints"]):
        assert ref.tokens == rec["step"] * cfg.batch_size * cfg.seq_len
        assert ref.lr == pytest.approx(lr_at(ref.step, cfg))
        loss = evaluate(loader.load(ref), val).loss
        assert loss == pytest.approx(rec["val_loss"], abs=1e-5)
        assert ref.meta["val_loss"] == rec["val_loss"]
    losses = [r["val_loss"] for r in record["checkpoints"]]
    assert losses[-1] < losses[0] < 6.3  # it learns (uniform over 512 tokens would be 6.24)


def test_checkpoint_folders_are_plain_hf(tiny_trajectory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ref = tiny_trajectory[-1]
    folder = Path(ref.location)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    hf = AutoModelForCausalLM.from_pretrained(str(folder))
    ours = CheckpointLoader(ref).load(ref)
    assert all(torch.equal(a, b) for a, b in zip(hf.state_dict().values(), ours.state_dict().values()))
    tok = AutoTokenizer.from_pretrained(str(folder))
    assert len(tok) == 512 and tokenizer_fingerprint(tok) == tokenizer_fingerprint(load_tokenizer(tiny_trajectory))


def test_default_token_sets_for_the_trajectory(tiny_trajectory):
    sets = default_token_sets(tiny_trajectory, quick=True)
    assert all(ts.seq_len == 32 for ts in sets.values())  # capped at the model's context
    assert sets["eval"].meta["source"] == "embedded[heldout]"
    model = CheckpointLoader(tiny_trajectory).load(-1)
    assert evaluate(model, sets["eval"]).loss < 6.3
    with pytest.raises(TokenSetError, match="context of 32"):
        default_token_sets(tiny_trajectory, quick=True, seq_len=64)


def test_same_seed_same_weights_and_rerun_is_cached(tmp_path):
    a = _train(tmp_path / "a", steps=6, checkpoints=1)
    b = _train(tmp_path / "b", steps=6, checkpoints=1)
    c = _train(tmp_path / "c", steps=6, checkpoints=1, seed=1)
    wa, wb, wc = (_weights(Path(t[-1].location)) for t in (a, b, c))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not torch.equal(
        wa["gpt_neox.layers.0.attention.query_key_value.weight"],
        wc["gpt_neox.layers.0.attention.query_key_value.weight"],
    )
    mtime = (tmp_path / "a" / "trajectory.json").stat().st_mtime_ns
    again = _train(tmp_path / "a", steps=6, checkpoints=1)  # finished run with the same config: returned as is
    assert again.labels == a.labels and (tmp_path / "a" / "trajectory.json").stat().st_mtime_ns == mtime
    with pytest.raises(TrainError, match="different config"):
        _train(tmp_path / "a", steps=7, checkpoints=1)


def test_resume_is_exact(tmp_path):
    full = _train(tmp_path / "full", steps=8, checkpoints=2, save_optimizer=True)
    half = Path(full[0].location)
    assert (half / "training_state.pt").is_file() and full[0].step == 4
    resumed = train_tiny(
        TrainConfig.tiny(steps=8, checkpoints=2, save_optimizer=True),
        tmp_path / "resumed",
        progress=False,
        data_dir=data_cache_dir(),
        num_threads=1,
        resume_from=half,
    )
    assert resumed.steps == [8]
    w_full, w_res = _weights(Path(full[-1].location)), _weights(Path(resumed[-1].location))
    assert all(torch.equal(w_full[k], w_res[k]) for k in w_full)


def test_cli_train_tiny(tmp_path):
    from typer.testing import CliRunner

    from losslens.cli.app import app

    out = tmp_path / "cli"
    res = CliRunner().invoke(
        app,
        [
            "train-tiny",
            "--out",
            str(out),
            "--tiny",
            "--steps",
            "4",
            "--checkpoints",
            "2",
            "--schedule",
            "cosine",
            "--peak-lr",
            "1e-3",
            "--weight-decay",
            "0.5",
            "--seed",
            "3",
            "--data-dir",
            str(data_cache_dir()),
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "wrote 2 checkpoints" in res.output and str(out.resolve()) in res.output
    traj = Trajectory.from_folder(out)
    cfg = TrainConfig.from_dict(traj.meta["config"])
    assert traj.steps == [2, 4] and cfg.schedule == "cosine" and cfg.weight_decay == 0.5 and cfg.seed == 3
    bad = CliRunner().invoke(app, ["train-tiny", "--out", str(tmp_path / "x"), "--tiny", "--schedule", "zigzag"])
    assert bad.exit_code != 0 and "zigzag" in bad.output
