"""`torchrun --nproc_per_node 2 -m losslens sharpness … --parallel data` (issue #26): the same
trace and λ_max as one process over all the curvature batches (float64 weights, 3 batches over 2
ranks), one JSON object printed (rank 0 only), and one-line errors outside torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from losslens.lm.core.tokenset import TokenSet
from losslens.lm.shared_settings import SettingsError
from losslens.measure.sharpness import SharpnessError, sharpness
from losslens.study.sweep.testing import SEQ, VOCAB, tiny_trajectory

ARGS = dict(
    num_matvecs=6,
    method="hutchinson",
    eigen_method="lanczos",
    max_iter=40,
    tol=1e-6,
    dtype="float64",
    threads=1,
    seed=2,
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dpcli")
    traj = tiny_trajectory(root / "tiny", n=2, seed=3)
    g = torch.Generator().manual_seed(0)
    data = root / "curv3.safetensors"
    TokenSet(torch.randint(0, VOCAB, (3, 2, SEQ), generator=g), name="curvature").save(data)
    return traj / "step-000200", data


def _cli_args(ckpt, data) -> list[str]:
    return [
        str(ckpt),
        "--data",
        str(data),
        "--num-matvecs",
        "6",
        "--method",
        "hutchinson",
        "--eigen-method",
        "lanczos",
        "--max-iter",
        "40",
        "--tol",
        "1e-6",
        "--dtype",
        "float64",
        "--threads",
        "1",
        "--seed",
        "2",
        "--json",
    ]


def _torchrun_sharpness(args: list[str], mode: str, *extra: str) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node 2 -m losslens sharpness ARGS --parallel MODE EXTRA`` (one thread
    per rank, this checkout on the path)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m"]
    cmd += ["losslens", "sharpness", *args, "--parallel", mode, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_torchrun_two_ranks_equal_one_process(setup):
    ckpt, data = setup
    one = sharpness(ckpt, data=data, **ARGS)
    r = _torchrun_sharpness(_cli_args(ckpt, data), "data")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count('"checkpoint"') == 1, r.stdout  # rank 0 alone prints
    two = json.loads(r.stdout[r.stdout.index("{") :])
    assert two["parallel"] == {"mode": "data", "world_size": 2, "backend": "gloo", "batches_per_rank": [2, 1]}
    assert two["trace"]["value"] == pytest.approx(one["trace"]["value"], rel=1e-9)
    assert two["eigen"]["values"][0] == pytest.approx(one["eigen"]["values"][0], rel=1e-9)
    assert two["dim"] == one["dim"] and one["parallel"]["world_size"] == 1


def test_torchrun_data_parallel_bfloat16_runs_in_float32_like_one_process(setup):
    """bfloat16 weights, 2 data-parallel ranks: the default float32 compute on every rank, the same
    numbers as one process's float32-compute run (summation order only)."""
    ckpt, data = setup
    one = sharpness(ckpt, data=data, **{**ARGS, "dtype": "bfloat16"})
    args = [a if a != "float64" else "bfloat16" for a in _cli_args(ckpt, data)]
    r = _torchrun_sharpness(args, "data")
    assert r.returncode == 0, r.stderr[-3000:]
    two = json.loads(r.stdout[r.stdout.index("{") :])
    assert one["compute_dtype"] == two["compute_dtype"] == "float32" and two["dtype"] == "bfloat16"
    assert two["trace"]["value"] == pytest.approx(one["trace"]["value"], rel=1e-5)
    assert two["eigen"]["values"][0] == pytest.approx(one["eigen"]["values"][0], rel=1e-5)


def test_parallel_data_outside_torchrun_is_one_clear_error(setup, monkeypatch):
    ckpt, data = setup
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SharpnessError, match="--parallel data runs under torchrun"):
        sharpness(ckpt, data=data, parallel="data", **ARGS)
    with pytest.raises(SharpnessError, match="--parallel 'model' is unknown; valid: none, data, fsdp"):
        sharpness(ckpt, data=data, parallel="model", **ARGS)
    with pytest.raises(SharpnessError, match="--backend auto is not available with --parallel data"):
        sharpness(ckpt, data=data, parallel="data", backend="auto", **ARGS)


@pytest.mark.parametrize("mode", ["data", "fsdp"])
def test_the_error_outside_torchrun_names_the_mode_and_command_given(setup, monkeypatch, mode):
    """The line names the --parallel mode and the command the user ran (issue #36: fsdp said "data")."""
    from typer.testing import CliRunner

    from losslens.cli.app import app

    ckpt, data = setup
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    r = CliRunner().invoke(app, ["sharpness", *_cli_args(ckpt, data), "--parallel", mode])
    assert r.exit_code == 2, r.output
    (line,) = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    other = {"data": "fsdp", "fsdp": "data"}[mode]
    assert f"--parallel {mode} runs under torchrun" in line and "-m losslens sharpness … --parallel " + mode in line
    assert f"--parallel {other}" not in line
    r = CliRunner().invoke(
        app, ["sweep", str(ckpt.parent), "--out", str(ckpt.parent / "r.sqlite"), "--quick", "--parallel", "data"]
    )
    assert r.exit_code == 2 and "-m losslens sweep … --parallel data" in r.output, r.output


def test_torchrun_sweep_writes_once_and_resumes(setup, tmp_path):
    """`sweep --parallel data` under torchrun: rank 0 writes every row once; the trace equals a
    one-process sweep's (float64); a rerun finds nothing left to do."""
    from losslens.study.sweep import Store, run_sweep
    from losslens.study.sweep.testing import tiny_plan_toml

    ckpt, data = setup
    traj = ckpt.parent
    body = 'loss = true\ntrace = { method = "hutchinson", num_matvecs = 4 }\n'
    plan = tiny_plan_toml(tmp_path / "p.toml", traj, probes=body)
    text = plan.read_text().replace(
        f'curvature = "{traj.resolve()}/data/curvature.safetensors"', f'curvature = "{data}"'
    )
    text = text.replace("curvature = [1, 2,", "curvature = [3, 2,")
    plan.write_text(text)
    one = run_sweep(traj, plan, out=tmp_path / "one.sqlite", progress=False, dtype=torch.float64, num_workers=1)
    assert one.n_failed == 0, one.failures
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "losslens",
        "sweep",
        str(traj),
        "--plan",
        str(plan),
        "--out",
        str(tmp_path / "two.sqlite"),
        "--dtype",
        "float64",
        "--threads",
        "1",
        "--quiet",
        "--parallel",
        "data",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    with Store(tmp_path / "one.sqlite") as a, Store(tmp_path / "two.sqlite") as b:
        ra, rb = a.results(), b.results()
    assert len(rb) == len(ra) and len(rb) > 0  # every row once
    ta = ra[ra.metric == "trace"].sort_values("checkpoint").value.to_numpy()
    tb = rb[rb.metric == "trace"].sort_values("checkpoint").value.to_numpy()
    assert len(ta) == 2 and tb == pytest.approx(ta, rel=1e-9)
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 ok, 0 failed, 4 already done" in again.stdout, again.stdout


def test_torchrun_fsdp_sharpness_matches_one_process(setup):
    """`sharpness --parallel fsdp`: the model, every vector and the estimators' state sharded over 2
    ranks (FSDP2, gradient differences); the estimates match one process's difference backend
    (the same products up to summation order), and the ranks' elements partition the parameters.
    Both run HF's float32 RMSNorm in float64 (losslens.lm.models.fidelity), so they also match the exact
    reverse products: without that the float64 step measured float32 rounding (7.5% off)."""
    ckpt, data = setup
    one = sharpness(ckpt, data=data, backend="difference", **ARGS)
    r = _torchrun_sharpness(_cli_args(ckpt, data), "fsdp")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count('"checkpoint"') == 1, r.stdout
    two = json.loads(r.stdout[r.stdout.index("{") :])
    par = two["parallel"]
    assert par["mode"] == "fsdp" and par["batches_per_rank"] == [2, 1]
    assert sum(par["elements_per_rank"]) == two["dim"] == one["dim"]
    assert all(0.3 * one["dim"] < e < 0.7 * one["dim"] for e in par["elements_per_rank"])
    assert two["backend"] == one["backend"] == "difference"
    assert two["trace"]["value"] == pytest.approx(one["trace"]["value"], rel=1e-8)
    assert two["eigen"]["values"][0] == pytest.approx(one["eigen"]["values"][0], rel=1e-7)
    exact = sharpness(ckpt, data=data, **ARGS)
    assert exact["backend"] == "reverse" and one["hvp_check"]["rel_error"] < 1e-8
    assert two["trace"]["value"] == pytest.approx(exact["trace"]["value"], rel=1e-6)
    assert two["eigen"]["values"][0] == pytest.approx(exact["eigen"]["values"][0], rel=1e-6)
    # no silent substitution: the default reverse backend was replaced out loud, with the reason
    assert two["backend_choice"]["requested"] == "reverse" and "FSDP2" in two["backend_choice"]["why"]
    assert "note: --backend reverse -> difference" in r.stderr
    # the sharded products' error is measured (on a miniature of the architecture), never left blank
    assert two["hvp_check"]["rel_error"] is not None and "miniature" in two["hvp_check"]["reference"]


def test_torchrun_fsdp_bfloat16_within_1e3_of_float32_exact_with_its_error_shown(setup):
    """README's sharded bfloat16 example on 2 gloo ranks: bfloat16 weights, the default float32
    compute (shards cast before sharding), trace and λ_max within 1e-3 of the exact reverse products
    of the same bfloat16 weights in float32; the measured error is in the output."""
    ckpt, data = setup
    args = [a if a != "float64" else "bfloat16" for a in _cli_args(ckpt, data)]
    r = _torchrun_sharpness(args, "fsdp", "--backend", "difference")
    assert r.returncode == 0, r.stderr[-3000:]
    two = json.loads(r.stdout[r.stdout.index("{") :])
    exact = sharpness(ckpt, data=data, **{**ARGS, "dtype": "bfloat16"})
    assert exact["compute_dtype"] == two["compute_dtype"] == "float32" and two["dtype"] == "bfloat16"
    assert two["trace"]["value"] == pytest.approx(exact["trace"]["value"], rel=1e-3)
    assert two["eigen"]["values"][0] == pytest.approx(exact["eigen"]["values"][0], rel=1e-3)
    assert two["hvp_check"]["rel_error"] <= 1e-2 and two["error_warning"] is None


def test_torchrun_fsdp_solver_state_on_disk_and_master_on_host_leave_the_numbers(setup):
    """`--state-device disk --master-device cpu` (issue #48) through the CLI at 2 ranks: the Hutch++
    sketch and the Lanczos basis memory-mapped on local disk, counted in the plans' host part with their
    transfer time; θ's copy kept on the host (recorded; on a CPU-only machine the host is the device,
    so no bytes move). The estimates equal one process's difference backend with its state in RAM."""
    ckpt, data = setup
    one = sharpness(ckpt, data=data, backend="difference", **{**ARGS, "method": "hutch++", "num_matvecs": 9})
    args = _cli_args(ckpt, data)
    args[args.index("hutchinson")], args[args.index("--num-matvecs") + 1] = "hutch++", "9"
    r = _torchrun_sharpness(args, "fsdp", "--state-device", "disk", "--master-device", "cpu")
    assert r.returncode == 0, r.stderr[-3000:]
    two = json.loads(r.stdout[r.stdout.index("{") :])
    assert two["trace"]["method"] == one["trace"]["method"] == "hutch++"
    for part in ("trace", "eigen"):
        mem, ref = two[part]["memory"], one[part]["memory"]
        assert mem["settings"]["basis_device"] == "disk" and ref["settings"]["basis_device"] == "cpu"
        assert mem["host_bytes"] > 0 and "host_bytes" not in ref
        assert mem["transfer"]["where"] == "disk" and mem["transfer"]["seconds"] > 0
    assert two["parallel"]["master_device"] == "cpu"
    assert two["trace"]["value"] == pytest.approx(one["trace"]["value"], rel=1e-8)
    assert two["eigen"]["values"][0] == pytest.approx(one["eigen"]["values"][0], rel=1e-7)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"master_device": "cpu"}, "--master-device cpu needs --parallel fsdp"),
        ({"state_device": "gpu"}, "--state-device 'gpu' is unknown; valid: device, cpu, disk"),
        ({"master_device": "disk", "parallel": "fsdp"}, "--master-device 'disk' is unknown; valid: device, cpu"),
    ],
)
def test_state_places_are_checked_before_anything_is_loaded(setup, options, match):
    ckpt, data = setup
    with pytest.raises(SettingsError, match=match):  # the CLI prints it in one line (exit 2)
        sharpness(ckpt, data=data, **{**ARGS, **options})
