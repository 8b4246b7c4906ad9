"""Checkpoint discovery, safe loading, hub-cache loading, architecture checks and LAWA."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from losslens.lm.checkpoints import (
    ArchitectureMismatchError,
    CheckpointLoader,
    CheckpointRef,
    CorruptCheckpointError,
    MissingWeightsError,
    NoCheckpointsError,
    RevisionNotCachedError,
    Trajectory,
    UnsafeCheckpointError,
    lawa,
    load_model,
    parse_step,
    weight_files,
)

VOCAB, CTX = 48, 16


def _neox(seed: int = 0, hidden: int = 8):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=CTX,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return GPTNeoXForCausalLM(cfg).eval()


def _save(model, folder: Path, fmt: str = "safetensors") -> Path:
    """Save ``model`` as an HF checkpoint folder: config.json + model.safetensors or pytorch_model.bin."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(str(folder))
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if fmt == "safetensors":
        save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    else:
        torch.save(sd, folder / "pytorch_model.bin")
    return folder


def _same_weights(model, ref_model) -> bool:
    a, b = model.state_dict(), ref_model.state_dict()
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------------
# discovery
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,step",
    [
        ("step-1000", 1000),
        ("step1000", 1000),
        ("step_1000", 1000),
        ("checkpoint-1000", 1000),
        ("iter_0001000", 1000),
        ("global_step1000", 1000),
        ("stage1-step1000-tokens4B", 1000),
        ("step-000100", 100),
        ("final", None),
        ("steps", None),
        ("model-7b", None),
    ],
)
def test_parse_step(name, step):
    assert parse_step(name) == step


@pytest.mark.parametrize(
    "names",
    [
        ["step-100", "step-20", "step-3000"],
        ["step100", "step20", "step3000"],
        ["step_100", "step_20", "step_3000"],
        ["checkpoint-100", "checkpoint-20", "checkpoint-3000"],
    ],
)
def test_from_folder_naming_schemes(tmp_path, names):
    model = _neox()
    for n in names:
        _save(model, tmp_path / n)
    (tmp_path / "notes").mkdir()  # ignored: not a checkpoint name
    traj = Trajectory.from_folder(tmp_path)
    assert traj.steps == [20, 100, 3000]  # numeric order, not lexicographic
    assert [c.kind for c in traj] == ["hf_dir"] * 3
    assert traj.labels == sorted(names, key=parse_step)
    assert traj[names[0]].step == 100 and traj[0].step == 20 and traj[-1].step == 3000
    assert traj.validate() == []


def test_from_folder_single_files_and_single_checkpoint(tmp_path):
    from safetensors.torch import save_file

    model = _neox()
    model.config.save_pretrained(str(tmp_path))
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    for s in (10, 30):
        save_file(sd, str(tmp_path / f"step{s}.safetensors"), metadata={"format": "pt"})
    traj = Trajectory.from_folder(tmp_path)
    assert traj.steps == [10, 30] and traj[0].kind == "safetensors"
    assert _same_weights(CheckpointLoader(traj).load(1), model)
    # a folder that is itself one checkpoint
    single = _save(model, tmp_path / "export")
    t1 = Trajectory.from_folder(single)
    assert len(t1) == 1 and t1[0].step is None


def test_empty_folder_raises(tmp_path):
    (tmp_path / "logs").mkdir()
    with pytest.raises(NoCheckpointsError, match="no checkpoints in"):
        Trajectory.from_folder(tmp_path)
    with pytest.raises(NoCheckpointsError):
        Trajectory.from_folder(tmp_path / "does-not-exist")


def test_trainer_state_json(tmp_path):
    model = _neox()
    for s in (10, 20):
        _save(model, tmp_path / f"checkpoint-{s}")
    log = [
        {"step": 5, "learning_rate": 1e-4, "loss": 3.0, "num_input_tokens_seen": 640},
        {"step": 10, "learning_rate": 2e-4, "loss": 2.5, "num_input_tokens_seen": 1280},
        {"step": 10, "eval_loss": 2.7},
        {"step": 15, "learning_rate": 3e-4, "loss": 2.2, "num_input_tokens_seen": 1920},
    ]
    (tmp_path / "checkpoint-20" / "trainer_state.json").write_text(
        json.dumps({"global_step": 20, "log_history": log + [{"step": 20, "learning_rate": 1e-5, "loss": 2.0}]})
    )
    (tmp_path / "checkpoint-10" / "trainer_state.json").write_text(
        json.dumps({"global_step": 10, "log_history": log[:3]})
    )
    # HF Trainer folders also hold pickled training_args.bin / optimizer.pt: they must be ignored
    torch.save({"not": "weights"}, tmp_path / "checkpoint-10" / "optimizer.pt")
    traj = Trajectory.from_folder(tmp_path)
    c10, c20 = traj
    assert c10.lr == pytest.approx(2e-4) and c10.tokens == 1280
    assert c10.meta["train_loss"] == 2.5 and c10.meta["val_loss"] == 2.7
    assert c20.lr == pytest.approx(1e-5)
    assert c20.tokens == 1920 and c20.meta["tokens_logged_at"] == 15  # latest logged value before step 20
    assert weight_files(tmp_path / "checkpoint-10") == [tmp_path / "checkpoint-10" / "model.safetensors"]


def test_trajectory_json_and_tokens_from_name(tmp_path):
    model = _neox()
    _save(model, tmp_path / "stage1-step100-tokens1B")
    _save(model, tmp_path / "stage1-step200-tokens2B")
    traj = Trajectory.from_folder(tmp_path)
    assert traj.steps == [100, 200] and traj[1].tokens == 2_000_000_000
    (tmp_path / "trajectory.json").write_text(
        json.dumps(
            {
                "name": "mine",
                "checkpoints": [
                    {"path": "stage1-step100-tokens1B", "step": 100, "tokens": 123, "lr": 0.5, "val_loss": 1.5}
                ],
            }
        )
    )
    traj = Trajectory.from_folder(tmp_path)
    assert traj.name == "mine" and traj[0].tokens == 123 and traj[0].lr == 0.5 and traj[0].meta["val_loss"] == 1.5
    assert traj[1].lr is None
    assert Trajectory.from_dict(traj.to_dict()).to_dict() == traj.to_dict()


def test_from_list(tmp_path):
    a, b = _neox(0), _neox(1)
    pa, pb = _save(a, tmp_path / "x" / "step-5"), _save(b, tmp_path / "y" / "best")
    traj = Trajectory.from_list([pb, CheckpointRef.from_path(pa, lr=0.1)], name="mixed-places")
    assert traj.labels == ["best", "step-5"] and traj[1].lr == 0.1
    loader = CheckpointLoader(traj)
    assert _same_weights(loader.load("best"), b) and _same_weights(loader.load("step-5"), a)


# ------------------------------------------------------------------------------------------------
# loading
# ------------------------------------------------------------------------------------------------


def test_loader_reuses_one_model(tmp_path):
    models = [_neox(s) for s in range(3)]
    for i, m in enumerate(models):
        _save(m, tmp_path / f"step-{i + 1}")
    loader = CheckpointLoader(Trajectory.from_folder(tmp_path))
    first = loader.load(0)
    for i, m in enumerate(models):
        got = loader.load(i)
        assert got is first and _same_weights(got, m) and not got.training
    fresh = load_model(tmp_path / "step-2")
    assert fresh is not first and _same_weights(fresh, models[1])


def test_loader_dtype(tmp_path):
    m = _neox()
    _save(m, tmp_path / "step-1")
    got = CheckpointLoader(Trajectory.from_folder(tmp_path), dtype=torch.float64).load(0)
    assert next(got.parameters()).dtype == torch.float64
    assert torch.equal(got.state_dict()["lm_head.weight"], m.state_dict()["lm_head.weight"].double())


def test_tied_weights_gpt2(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=8, n_layer=1, n_head=2, n_positions=CTX)).eval()
    m.save_pretrained(str(tmp_path / "step-1"))  # writes one copy of the tied embedding
    got = load_model(tmp_path / "step-1")
    assert _same_weights(got, m)
    assert got.lm_head.weight.data_ptr() == got.transformer.wte.weight.data_ptr()


def test_bin_weights_only_accepted(tmp_path):
    m = _neox()
    _save(m, tmp_path / "step-1", fmt="bin")
    assert _same_weights(load_model(tmp_path / "step-1"), m)


def test_pickle_refused_unless_allowed(tmp_path):
    m = _neox()
    folder = _save(m, tmp_path / "step-1", fmt="bin")
    sd = m.state_dict()
    sd["_extra"] = torch.tensor(0)
    payload = {"state_dict": dict(sd), "trainer": _Custom()}
    torch.save(payload, folder / "pytorch_model.bin")
    with pytest.raises(UnsafeCheckpointError, match="allow_pickle=True") as err:
        load_model(folder)
    assert "pytorch_model.bin" in str(err.value) and "step-1" in str(err.value)
    problems = Trajectory.from_folder(tmp_path).validate()
    assert [p.kind for p in problems] == ["unsafe"]
    # with the explicit flag the same file loads (the custom object is ignored, the state dict used)
    payload["state_dict"].pop("_extra")
    torch.save(payload, folder / "pytorch_model.bin")
    with pytest.warns(UserWarning, match="full pickle"):
        got = load_model(folder, allow_pickle=True)
    assert _same_weights(got, m)


class _Custom:  # a custom class: unpickling it would need arbitrary code
    pass


def test_corrupt_and_missing_files_are_reported_not_fatal(tmp_path):
    m = _neox()
    for s in (1, 2, 3):
        _save(m, tmp_path / f"step-{s}")
    (tmp_path / "step-2" / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    (tmp_path / "step-3" / "model.safetensors").unlink()
    traj = Trajectory.from_folder(tmp_path)
    assert traj.steps == [1, 2, 3]  # listing is not affected
    problems = {p.label: p for p in traj.validate()}
    assert set(problems) == {"step-2", "step-3"}
    assert problems["step-2"].kind == "corrupt" and "model.safetensors" in problems["step-2"].message
    assert problems["step-3"].kind == "missing" and "step-3" in problems["step-3"].message
    loader = CheckpointLoader(traj)
    assert _same_weights(loader.load("step-1"), m)
    with pytest.raises(CorruptCheckpointError, match=r"step-2.*model\.safetensors"):
        loader.load("step-2")
    with pytest.raises(MissingWeightsError, match="no weight file"):
        loader.load("step-3")
    assert _same_weights(loader.load("step-1"), m)  # the loader still works afterwards
    with pytest.raises(CorruptCheckpointError):
        traj.validate(raise_errors=True)


def test_corrupt_bin_is_corrupt_not_unsafe(tmp_path):
    m = _neox()
    folder = _save(m, tmp_path / "step-1", fmt="bin")
    (folder / "pytorch_model.bin").write_bytes(b"garbage" * 10)
    with pytest.raises(CorruptCheckpointError, match="pytorch_model.bin"):
        load_model(folder)


def test_missing_config(tmp_path):
    m = _neox()
    folder = _save(m, tmp_path / "step-1")
    (folder / "config.json").unlink()
    with pytest.raises(MissingWeightsError, match="config.json"):
        load_model(folder)


def test_mixed_architectures(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    small, wide = _neox(0, hidden=8), _neox(0, hidden=16)
    _save(small, tmp_path / "step-1")
    _save(wide, tmp_path / "step-2")
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=8, n_layer=1, n_head=2, n_positions=CTX)).eval()
    gpt2.save_pretrained(str(tmp_path / "step-3"))
    traj = Trajectory.from_folder(tmp_path)
    loader = CheckpointLoader(traj)
    first = loader.load("step-1")
    # every checkpoint is evaluated under its own config (issue #13: the loader used to build one
    # model from the first config and refuse -- or worse, silently accept -- the others)
    got = loader.load("step-2")
    assert got is not first and got.config.hidden_size == 16 and _same_weights(got, wide)
    got = loader.load("step-3")
    assert type(got).__name__ == "GPT2LMHeadModel" and _same_weights(got, gpt2)
    assert _same_weights(loader.load("step-1"), small)
    kinds = {p.label: p.kind for p in traj.validate()}
    assert kinds == {"step-2": "architecture", "step-3": "architecture"}
    with pytest.raises(ArchitectureMismatchError, match="step-2"):
        lawa([traj[0], traj[1]])


# ------------------------------------------------------------------------------------------------
# derived checkpoints
# ------------------------------------------------------------------------------------------------


def test_lawa_equals_hand_mean(tmp_path):
    models = [_neox(s) for s in range(4)]
    for i, m in enumerate(models):
        _save(m, tmp_path / f"step-{(i + 1) * 10}")
    traj = Trajectory.from_folder(tmp_path)
    t2 = traj.with_lawa(k=3)
    avg = t2[-1]
    assert avg.derived and avg.kind == "derived" and avg.label == "lawa3@step-40"
    assert avg.derived_from == ("step-20", "step-30", "step-40") and avg.step == 40
    loader = CheckpointLoader(t2)
    got = loader.load(avg).state_dict()
    for k, v in got.items():
        hand = sum(m.state_dict()[k].double() for m in models[1:]) / 3
        assert torch.allclose(v.double(), hand, atol=1e-7, rtol=0), k
    # weighted soup, and LAWA ending at an earlier checkpoint
    soup = lawa([traj[0], traj[3]], weights=[3, 1], label="soup")
    sd = loader.state_dict(soup)
    k = "lm_head.weight"
    assert torch.allclose(
        sd[k].double(), 0.75 * models[0].state_dict()[k].double() + 0.25 * models[3].state_dict()[k].double(), atol=1e-7
    )
    early = traj.with_lawa(k=2, at="step-20")[-1]
    assert early.derived_from == ("step-10", "step-20") and early.step == 20
    # derived refs survive serialisation
    back = Trajectory.from_dict(t2.to_dict())
    assert back[-1].derived_from == avg.derived_from and back[-1].sources[0].label == "step-20"
    assert torch.equal(CheckpointLoader(back).state_dict(back[-1])[k], loader.state_dict(avg)[k])
    with pytest.raises(Exception, match="k=9"):
        traj.with_lawa(k=9)


# ------------------------------------------------------------------------------------------------
# hub (offline, from a local cache laid out like huggingface_hub's)
# ------------------------------------------------------------------------------------------------


def _fake_hub_cache(cache: Path, repo_id: str, revisions: dict[str, torch.nn.Module]) -> None:
    """``<cache>/models--org--name/{refs/<rev> -> commit, snapshots/<commit>/files, blobs/}``."""
    from tests.hub_cache import add_revision

    for rev, model in revisions.items():
        add_revision(cache, repo_id, rev, _save(model, cache / "tmp" / rev))
    shutil.rmtree(cache / "tmp")


def test_hub_offline_from_local_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    models = {"step1000": _neox(1), "step2000": _neox(2), "step143000": _neox(3), "main": _neox(4)}
    _fake_hub_cache(tmp_path, "org/tiny", models)
    traj = Trajectory.from_hub("org/tiny", ["step2000", "step1000"], cache_dir=tmp_path)
    assert traj.labels == ["step2000", "step1000"] and traj[0].kind == "hub" and traj[0].revision == "step2000"
    loader = CheckpointLoader(traj)
    assert _same_weights(loader.load("step1000"), models["step1000"])
    assert _same_weights(loader.load("step2000"), models["step2000"])
    # pattern over the revisions present in the cache, ordered by step
    pat = Trajectory.from_hub("org/tiny", "step*", cache_dir=tmp_path)
    assert pat.labels == ["step1000", "step2000", "step143000"] and pat.steps == [1000, 2000, 143000]
    assert Trajectory.from_hub("org/tiny", "re:step\\d{4}", cache_dir=tmp_path).labels == ["step1000", "step2000"]
    assert Trajectory.from_hub("org/tiny", "step1*", available=["step1000", "step3000"], cache_dir=tmp_path).labels == [
        "step1000"
    ]
    assert pat.validate() == []
    # the same cache works with transformers' own from_pretrained(revision=...)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(
        "org/tiny", revision="step143000", cache_dir=str(tmp_path), local_files_only=True
    )
    assert _same_weights(loader.load(pat[2]), hf)


def test_hub_revision_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _fake_hub_cache(tmp_path, "org/tiny", {"step1000": _neox(1)})
    traj = Trajectory.from_hub("org/tiny", ["step1000", "step9000"], cache_dir=tmp_path)
    loader = CheckpointLoader(traj)
    loader.load("step1000")
    with pytest.raises(RevisionNotCachedError, match=r"step9000.*(download it first|HF_HUB_OFFLINE)") as err:
        loader.load("step9000")
    assert "offline" in str(err.value)
    assert [p.kind for p in traj.validate()] == ["hub"]
    with pytest.raises(NoCheckpointsError, match="matches"):
        Trajectory.from_hub("org/tiny", "stage1-*", cache_dir=tmp_path)


def test_gptneox_saved_by_transformers_loads_with_legacy_head_key(tmp_path):
    """transformers 5 saves GPT-NeoX's head as ``embed_out.weight`` (as real Pythia checkpoints do)."""
    from safetensors import safe_open
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    model = GPTNeoXForCausalLM(
        GPTNeoXConfig(vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    )
    model.save_pretrained(tmp_path / "step-1")
    with safe_open(str(tmp_path / "step-1" / "model.safetensors"), "pt") as f:
        assert "embed_out.weight" in list(f.keys())
    loaded = load_model(Trajectory.from_folder(tmp_path)[0])
    for (n, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), n
