"""Hub trajectories from the command line (issue #17): ``hf:ORG/NAME@REVISIONS`` in every command,
offline from a hand-built Hugging Face cache, with the LR and tokens of a schedule recorded in the store."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from losslens.lm.checkpoints import CheckpointLoader, open_checkpoint, open_trajectory
from losslens.lm.checkpoints.schedule import PRESETS
from losslens.cli.app import app
from losslens.study.sweep import Store
from tests.hub_cache import add_ref_only, add_revision

REPO = "org/tiny"
STEPS = [1000, 2000, 3000, 4000, 5000, 6000]
SCHEDULE = "cosine:peak=1e-3,warmup=1000,total=6000,final=0.1"
PLAN = (
    'name = "hub"\nseed = 0\n[data]\neval = [2, 2, 16]\ncalibration = [2, 2, 16]\ncurvature = [1, 2, 16]\n'
    '[probes]\nloss = true\nquant = ["rtn:4"]\ntrace = { method = "hutchinson", num_matvecs = 2 }\n'
)


def cosine(step: int, peak=1e-3, warmup=1000, total=6000, final=0.1) -> float:
    """SCHEDULE written out: linear warm-up, then a half cosine from peak to final * peak at total."""
    if step <= warmup:
        return peak * step / warmup
    low = final * peak
    return low + (peak - low) * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A cache with revisions step1000 .. step6000 of a tiny GPT-NeoX (weights drift from step to step),
    each saved with save_pretrained and its BPE tokenizer, plus a `main` ref whose snapshot is missing."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from losslens.lm.data.tokenizers import train_bpe_tokenizer

    root = tmp_path_factory.mktemp("hub")
    cache = root / "cache"
    tok = train_bpe_tokenizer("the quick brown fox jumps over the lazy dog; " * 40, vocab_size=300)
    cfg = GPTNeoXConfig(
        vocab_size=len(tok),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(1)
    for step in STEPS:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.02).add_(0.02 * torch.randn(p.shape, generator=g))
        folder = root / "saved" / f"step{step}"
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        add_revision(cache, REPO, f"step{step}", folder)
    add_ref_only(cache, REPO, "main")
    shutil.rmtree(root / "saved")
    return cache


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _sweep(hub, name, out, plan, *extra):
    return _invoke("sweep", name, "--cache-dir", hub, "--plan", plan, "--out", out, "--quiet", "--threads", "1", *extra)


def _plan(tmp_path):
    p = tmp_path / "plan.toml"
    p.write_text(PLAN)
    return p


def test_sweep_hub_trajectory_with_schedule_then_correlate_on_lr(hub, tmp_path):
    plan, out = _plan(tmp_path), tmp_path / "s.sqlite"
    sched = ["--schedule", SCHEDULE, "--tokens-per-step", "4096"]
    r = _sweep(hub, f"hf:{REPO}@step*", out, plan, *sched)
    assert r.exit_code == 0, r.output
    assert "6 checkpoints, 18 rows: 18 ok, 0 failed" in r.output
    with Store(out) as st:
        ck, df = st.checkpoints(), st.results()
    assert ck["label"].tolist() == [f"step{s}" for s in STEPS]  # step order, `main` not matched by step*
    lr = [cosine(s) for s in STEPS]
    assert ck["lr"].tolist() == pytest.approx(lr, rel=1e-12, abs=0)
    assert ck["tokens"].tolist() == [s * 4096 for s in STEPS]
    # correlate --control lr: the partial correlation on the schedule's LR, recomputed here by hand
    r = _invoke(
        "correlate",
        out,
        "--x",
        "trace",
        "--y",
        "rtn:4:g128",
        "--control",
        "lr",
        "--method",
        "pearson",
        "--n-boot",
        "50",
        "--json",
    )
    assert r.exit_code == 0, r.output
    part = next(row for row in json.loads(r.output) if row["controls"] == "lr")
    from losslens.study.analysis import series

    x, y = series(df, "trace").to_numpy(float), series(df, "rtn:4:g128").to_numpy(float)
    A = np.column_stack([np.ones(len(lr)), lr])
    rx, ry = (v - A @ np.linalg.lstsq(A, v, rcond=None)[0] for v in (x, y))
    assert part["n"] == 6 and part["r"] == pytest.approx(float(np.corrcoef(rx, ry)[0, 1]), abs=1e-9)
    # a resumed sweep without --schedule keeps the LR and tokens it derived
    again = _sweep(hub, f"hf:{REPO}@step*", out, plan)
    assert again.exit_code == 0 and "18 already done" in again.output
    with Store(out) as st:
        assert st.checkpoints()["lr"].tolist() == pytest.approx(lr, rel=1e-12, abs=0)


def test_sweep_missing_revision_offline_is_a_failed_row_with_the_download_command(hub, tmp_path):
    plan, out = _plan(tmp_path), tmp_path / "m.sqlite"
    r = _sweep(hub, f"hf:{REPO}@step2000,step1000,step9000", out, plan)
    assert r.exit_code == 1, r.output  # some rows failed
    assert "RevisionNotCachedError x3 (step9000)" in r.output
    cmd = f"hf download {REPO} --revision step9000 --cache-dir {hub}"
    with Store(out) as st:
        df = st.results()
        assert st.checkpoints()["label"].tolist() == ["step2000", "step1000", "step9000"]  # a list keeps its order
    failed = df[df["status"] == "failed"]
    assert set(failed["checkpoint"]) == {"step9000"} and len(failed) == 3
    assert all(cmd in e and "HF_HUB_OFFLINE" in e for e in failed["error"])
    assert set(df.loc[df["status"] == "ok", "checkpoint"]) == {"step1000", "step2000"}
    # nothing cached at all: no tokenizer to build the data with, and the message says what to download
    r = _sweep(hub, f"hf:{REPO}@step9000", tmp_path / "none.sqlite", plan)
    assert r.exit_code == 2 and cmd in r.output


def test_main_ref_without_snapshot(hub):
    traj = open_trajectory(f"hf:{REPO}@*", cache_dir=hub)
    assert traj.labels == [f"step{s}" for s in STEPS] + ["main"]  # refs in the cache; `main` has no step
    assert [p.kind for p in traj.validate(check_weights=False)] == ["hub"]
    r = _invoke("sharpness", f"hf:{REPO}", "--cache-dir", hub, "--quick", "--num-matvecs", "3")
    assert r.exit_code == 2 and f"hf download {REPO} --revision main --cache-dir {hub}" in r.output


def test_schedule_sidecar_in_the_sweep_output(hub, tmp_path):
    plan, study = _plan(tmp_path), tmp_path / "study"
    study.mkdir()
    (study / "trajectory.json").write_text(json.dumps({"schedule": "pythia-160m"}))
    r = _sweep(hub, f"hf:{REPO}@re:step[13]000", study / "s.sqlite", plan)
    assert r.exit_code == 0, r.output
    with Store(study / "s.sqlite") as st:
        ck = st.checkpoints()
    pythia = PRESETS["pythia-160m"]
    assert ck["label"].tolist() == ["step1000", "step3000"]
    assert ck["lr"].tolist() == [pythia.lr(1000), pythia.lr(3000)]
    assert ck["tokens"].tolist() == [1000 * 2_097_152, 3000 * 2_097_152]


def test_folder_sidecar_fills_and_the_option_overrides(tmp_path):
    """trajectory.json's "schedule" fills what its checkpoint entries lack; --schedule replaces both."""
    from losslens.lm.checkpoints import Trajectory

    for step in (100, 200, 300):
        (tmp_path / f"step-{step:06d}").mkdir()
        (tmp_path / f"step-{step:06d}" / "config.json").write_text("{}")
    (tmp_path / "trajectory.json").write_text(
        json.dumps(
            {
                "schedule": "linear:peak=1e-3,total=400",
                "tokens_per_step": 64,
                "checkpoints": [{"path": "step-000100", "lr": 5e-4}],
            }
        )
    )
    traj = Trajectory.from_folder(tmp_path)
    assert traj.steps == [100, 200, 300]
    assert [r.lr for r in traj] == [5e-4, pytest.approx(1e-3 * 200 / 400), pytest.approx(1e-3 * 100 / 400)]
    assert [r.tokens for r in traj] == [6400, 12800, 19200]
    assert traj[1].meta["lr_source"].startswith("schedule linear:peak=0.001,total=400")
    over = open_trajectory(tmp_path, schedule="constant:peak=2e-3,warmup=150")
    assert [r.lr for r in over] == [pytest.approx(2e-3 * 100 / 150), 2e-3, 2e-3]
    assert over[0].meta["lr_recorded"] == 5e-4
    _, ref = open_checkpoint(tmp_path / "step-000200", tokens_per_step=10)
    assert ref.label == "step-000200" and ref.tokens == 2000 and ref.lr == pytest.approx(5e-4)
    (tmp_path / "trajectory.json").write_text(json.dumps({"schedule": "cosine:peak=1e-3"}))
    r = _invoke("sweep", tmp_path, "--out", tmp_path / "x.sqlite", "--quick")
    assert r.exit_code == 2 and "needs total=" in r.output and "trajectory.json" in r.output


def test_commands_open_hub_names(hub, tmp_path):
    # sharpness: a pattern with --label, the LR and tokens of a preset in the JSON
    r = _invoke(
        "sharpness",
        f"hf:{REPO}@step*",
        "--label",
        "step3000",
        "--cache-dir",
        hub,
        "--quick",
        "--num-matvecs",
        "3",
        "--max-iter",
        "3",
        "--schedule",
        "pythia-160m",
        "--json",
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{") :])
    assert out["checkpoint"] == "step3000" and out["lr"] == PRESETS["pythia-160m"].lr(3000)
    assert out["tokens"] == 3000 * 2_097_152
    # quantize: one revision, default token sets built with the tokenizer in its snapshot
    r = _invoke("quantize", f"hf:{REPO}@step2000", "--cache-dir", hub, "--quick", "--spec", "rtn:4:g32", "--json")
    assert r.exit_code == 0, r.output
    row = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("{")))
    assert row["label"] == "step2000" and row["step"] == 2000
    traj = open_trajectory(f"hf:{REPO}@step2000", cache_dir=hub)
    from losslens.lm.core.next_token_loss import evaluate
    from losslens.lm.data import default_token_sets

    ev = default_token_sets(traj, quick=True)["eval"]
    assert row["fp_loss"] == pytest.approx(evaluate(CheckpointLoader(traj).load(traj[0]), ev).loss, rel=1e-6)
    # explain: a pattern with --label; the schedule's LR is reported
    r = _invoke(
        "explain",
        f"hf:{REPO}@step*",
        "--label",
        "step2000",
        "--cache-dir",
        hub,
        "--quick",
        "--spec",
        "rtn:4:g32",
        "--trace-hvps",
        "3",
        "--schedule",
        SCHEDULE,
        "--out",
        tmp_path / "e.json",
        "--json",
    )
    assert r.exit_code == 0, r.output
    got = json.loads((tmp_path / "e.json").read_text())
    assert got["checkpoint"] == "step2000" and got["lr"] == pytest.approx(cosine(2000), rel=1e-12)
    # surface: B is the revision before A in the hub trajectory, or given as a hub name
    from losslens.geometry.surfaces.surface import Surface

    points = []
    for args in (
        (f"hf:{REPO}@step*", "--label", "step3000"),
        (f"hf:{REPO}@step3000", "--previous", f"hf:{REPO}@step2000"),
    ):
        r = _invoke(
            "surface",
            *args,
            "--cache-dir",
            hub,
            "--quick",
            "--grid",
            "2",
            "--json",
            tmp_path / "s.json",
            "--out",
            tmp_path / "s.html",
            "-q",
        )
        assert r.exit_code == 0, r.output
        assert f"hf:{REPO}@step2000" in (tmp_path / "s.html").read_text()  # B, named on the page
        points.append(Surface.load(tmp_path / "s.json").points)
    assert points[0] == points[1]
    r = _invoke(
        "surface", f"hf:{REPO}@step1000", "--cache-dir", hub, "--quick", "--grid", "2", "--out", tmp_path / "s.html"
    )
    assert r.exit_code == 2 and "no checkpoint before 'step1000'" in r.output
    # a malformed name is one line, exit 2
    r = _invoke("quantize", "hf:org/tiny@step1000,,step2000", "--cache-dir", hub)
    assert r.exit_code == 2 and "empty revision" in r.output
