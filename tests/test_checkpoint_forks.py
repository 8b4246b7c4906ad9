"""Issue #47 item 2: forks of a real checkpoint (an HF folder or a GGUF file) under the seeds' schedules.

A tiny random Llama saved with ``save_pretrained`` (tied embeddings, as SmolLM2's) and a tiny
BOS-adding tokenizer; a user's text file; a few updates of 2×32 tokens."""

from __future__ import annotations

import json
import random
import re

import pytest
import torch
from safetensors.torch import load_file

from losslens.lm.checkpoints import Trajectory
from losslens.lm.core.tokenset import TokenSet
from losslens.lm.train.checkpoint_forks import fork_pretrained
from losslens.lm.train.config import TrainError
from losslens.lm.train.fork_schedule import ForkSchedule

transformers = pytest.importorskip("transformers")

SCHEDULES = [ForkSchedule("wsd", steps=6, cooldown_at=3), ForkSchedule("cosine", steps=6)]
KW = dict(lr=1e-3, min_lr_ratio=0.1, seq_len=32, batch_size=2, checkpoints=3, val_batches=1, num_threads=1)


class Killed(RuntimeError):
    pass


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    chars = "abcdefghijklmnopqrstuvwxyz .,\n"
    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", add_bos_token=True
    )


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("base")
    tok = _tokenizer()
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    rng = random.Random(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "home"]
    paragraphs = [" ".join(rng.choice(words) for _ in range(80)) + "." for _ in range(120)]
    (root / "text.txt").write_text("\n\n".join(paragraphs))
    return root / "model", root / "text.txt"


def test_forks_of_a_pretrained_checkpoint_are_trajectories_with_their_schedule(base, tmp_path):
    model_dir, text = base
    trajs = fork_pretrained(model_dir, SCHEDULES, tmp_path, text=text, progress=False, **KW)
    assert [t.name for t in trajs] == ["wsd-cd3-n6-s0", "cosine-n6-s0"]
    for sched, traj in zip(SCHEDULES, trajs):
        again = Trajectory.from_folder(tmp_path / traj.name)
        assert again.steps == [0, 2, 4, 6] and again.meta["complete"]
        resolved = ForkSchedule.from_dict(again.meta["fork"]["schedule"])
        records = json.loads((tmp_path / traj.name / "trajectory.json").read_text())["checkpoints"]
        assert [r["lr"] for r in records[1:]] == [pytest.approx(resolved.lr(s)) for s in (2, 4, 6)]
        assert records[0]["phase"] == "start" and records[-1]["lr"] == pytest.approx(1e-4)  # decayed to lr·0.1
        assert all(r["val_loss"] > 0 for r in records)
        assert again.meta["data"]["framing"]["name"] == "bos"
        rows = TokenSet.load(  # the validation rows, framed as the tokenizer frames a document
            tmp_path / traj.name / "validation.safetensors"
        ).sequences()
        assert (rows[:, 0] == 0).all()
        states = sorted(p.parent.name for p in (tmp_path / traj.name).glob("step-*/training_state.pt"))
        assert states == ["step-000006"]  # only the newest checkpoint keeps AdamW's state
    wsd = ForkSchedule.from_dict(trajs[0].meta["fork"]["schedule"])
    assert wsd.lr(3) == pytest.approx(1e-3) and wsd.lr(6) == pytest.approx(1e-4)
    index = json.loads((tmp_path / "forks.json").read_text())
    assert {e["path"] for e in index["forks"]} == {"wsd-cd3-n6-s0", "cosine-n6-s0"}
    # a finished fork is returned as it is; a parent schedule has nothing to continue
    assert (
        fork_pretrained(model_dir, SCHEDULES[:1], tmp_path, text=text, progress=False, **KW)[0].steps == trajs[0].steps
    )
    with pytest.raises(TrainError, match="no schedule to continue"):
        fork_pretrained(model_dir, [ForkSchedule("parent", steps=2)], tmp_path, text=text, progress=False, **KW)


def test_a_killed_fork_resumes_to_the_same_weights(base, tmp_path):
    model_dir, text = base
    whole = fork_pretrained(model_dir, SCHEDULES[1:], tmp_path / "whole", text=text, progress=False, **KW)[0]

    def kill(model, step, lr, loss):
        if step == 5:
            raise Killed("killed after the checkpoint of step 4")

    with pytest.raises(Killed):
        fork_pretrained(model_dir, SCHEDULES[1:], tmp_path / "cut", text=text, progress=False, on_step=kill, **KW)
    cut = Trajectory.from_folder(tmp_path / "cut" / whole.name)
    assert cut.steps == [0, 2, 4] and not cut.meta["complete"]
    resumed = fork_pretrained(model_dir, SCHEDULES[1:], tmp_path / "cut", text=text, progress=False, **KW)[0]
    assert resumed.steps == whole.steps and any("resumed at step 4" in n for n in resumed.meta["notes"])
    a = load_file(str(tmp_path / "whole" / whole.name / "step-000006" / "model.safetensors"))
    b = load_file(str(tmp_path / "cut" / whole.name / "step-000006" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit for bit
    losses = [[r["val_loss"] for r in json.loads((t / "trajectory.json").read_text())["checkpoints"]] for t in
              (tmp_path / "whole" / whole.name, tmp_path / "cut" / whole.name)]  # fmt: skip
    assert losses[0] == losses[1]


def test_progress_lines_in_a_pipe(base, tmp_path, capsys, monkeypatch):
    """The shared progress lines (losslens.geometry.base.progress): label, updates done / planned, percent,
    ETA, then the step, loss and LR; on stderr only."""
    model_dir, text = base
    monkeypatch.setenv("LOSSLENS_PROGRESS_EVERY", "0")  # a line per update
    fork_pretrained(model_dir, [ForkSchedule("constant", steps=4)], tmp_path, text=text, **KW)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and any(ln.startswith("[fork] planned: 4 steps for constant-n4-s0, ~") for ln in lines), err
    two = next(ln for ln in lines if ln.startswith("[fork] constant-n4-s0: 2/4 steps (50%), "))
    assert re.search(r", ETA \d+:\d\d \(step 2, loss \d+\.\d{3}, lr 1\.00e-03\)$", two), two
    assert any(ln.startswith("[fork] constant-n4-s0: 4/4 steps (100%)") for ln in lines), err
    fork_pretrained(model_dir, [ForkSchedule("constant", steps=2)], tmp_path, text=text, progress=False, **KW)
    assert capsys.readouterr().err == ""  # progress=False (the CLI's --quiet): silent


def test_a_gguf_checkpoint_forks(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    from tests.gguf_files import train_tiny_llama, write_gguf

    monkeypatch.setenv("LOSSLENS_CACHE_DIR", str(tmp_path / "cache"))
    model, tok = train_tiny_llama(steps=2)
    path = write_gguf(tmp_path / "tiny.gguf", model, tok, linear_type="F32")
    text = tmp_path / "text.txt"
    text.write_text("\n\n".join(f"paragraph {i}: the cat sat on the mat and looked at the dog." * 8 for i in range(60)))
    (traj,) = fork_pretrained(path, [ForkSchedule("linear", steps=2)], tmp_path / "forks", text=text, **KW)
    assert traj.steps == [0, 1, 2] and traj.meta["fork"]["base"] == str(path.resolve())
    assert traj[0].meta["val_loss"] > traj[-1].meta["val_loss"] > 0  # the dequantized base, then trained on


def test_cli_fork_of_a_pretrained_folder_and_a_hub_name(base, tmp_path, monkeypatch):
    """`losslens fork` on an HF folder (and on hf:ORG/NAME through the hub cache) calls fork_pretrained."""
    from typer.testing import CliRunner

    from losslens.cli.app import app
    from tests.hub_cache import add_revision

    model_dir, text = base
    common = ["--steps", "4", "--checkpoints", "2", "--seq-len", "32", "--batch-size", "2", "--start-lr", "1e-3",
              "--text", str(text), "--threads", "1", "--quiet"]  # fmt: skip
    out = tmp_path / "forks"
    res = CliRunner().invoke(app, ["fork", str(model_dir), "--schedule", "wsd,cosine", "--seeds", "0,1",
                                   "--cooldown-at", "2", "--out", str(out), *common])  # fmt: skip
    assert res.exit_code == 0, res.output
    names = ["wsd-cd2-n4-s0", "cosine-n4-s0", "wsd-cd2-n4-s1", "cosine-n4-s1"]
    assert [line.split(":")[0] for line in res.stdout.splitlines() if "checkpoints, steps 0..4" in line] == names
    assert "at the base" in res.output and "losslens sweep" in res.output
    index = json.loads((out / "forks.json").read_text())
    assert sorted(e["path"] for e in index["forks"]) == sorted(names)
    traj = Trajectory.from_folder(out / "wsd-cd2-n4-s1")
    assert traj.steps == [0, 2, 4] and traj.meta["fork"]["seed"] == 1
    assert traj.meta["fork"]["base"] == str(model_dir.resolve())
    assert ForkSchedule.from_dict(traj.meta["fork"]["schedule"]).lr(4) == pytest.approx(1e-4)  # start LR / 10
    # options of a train-tiny parent are refused by name; a pretrained base needs --steps
    bad = CliRunner().invoke(app, ["fork", str(model_dir), "--at", "last", "--out", str(tmp_path / "x"), *common])
    assert bad.exit_code != 0 and "--at apply to a train-tiny parent only" in bad.output
    bad = CliRunner().invoke(app, ["fork", str(model_dir), "--out", str(tmp_path / "x"), "--quiet"])
    assert bad.exit_code != 0 and "pass --steps N" in bad.output
    # a hub name through the (offline) hub cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = tmp_path / "hub"
    add_revision(cache, "org/tiny-llama", "main", model_dir)
    res = CliRunner().invoke(app, ["fork", "hf:org/tiny-llama", "--schedule", "constant", "--cache-dir", str(cache),
                                   "--out", str(tmp_path / "hub-forks"), *common])  # fmt: skip
    assert res.exit_code == 0, res.output
    traj = Trajectory.from_folder(tmp_path / "hub-forks" / "constant-n4-s0")
    assert traj.meta["fork"]["base"] == "hf:org/tiny-llama" and traj.steps == [0, 2, 4]
