"""`losslens sweep | sharpness | correlate` through the Typer app (in-process CliRunner)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from losslens.cli.app import app
from losslens.study.sweep import Plan, Store, run_sweep
from losslens.study.sweep.testing import tiny_plan_toml, tiny_trajectory

CHEAP = 'loss = true\nquant = ["rtn:4"]\ntrace = { method = "hutchinson", num_matvecs = 2 }\n'
N_CKPT = 4


@pytest.fixture(scope="module")
def traj(tmp_path_factory):
    return tiny_trajectory(tmp_path_factory.mktemp("traj") / "tiny", n=N_CKPT, seed=1)


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


def test_sweep_command_prints_summary_and_exports(traj, tmp_path, runner):
    plan = tiny_plan_toml(tmp_path / "plan.toml", traj, probes=CHEAP)
    out = tmp_path / "r.sqlite"
    args = [
        "sweep",
        str(traj),
        "--out",
        str(out),
        "--plan",
        str(plan),
        "--quiet",
        "--threads",
        "1",
        "--export",
        str(tmp_path / "r.csv"),
    ]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert f"{N_CKPT} checkpoints, {3 * N_CKPT} rows: {3 * N_CKPT} ok, 0 failed, 0 already done" in r.output
    assert "correlations across checkpoints" in r.output and "FP-convergence onset" in r.output
    assert (tmp_path / "r.csv").is_file()
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and f"0 ok, 0 failed, {3 * N_CKPT} already done" in again.output
    # a different plan on the same store: refused with a clear message, exit 2
    other = tiny_plan_toml(tmp_path / "other.toml", traj, probes="loss = true\n")
    r = runner.invoke(app, ["sweep", str(traj), "--out", str(out), "--plan", str(other), "--quiet"])
    assert r.exit_code == 2 and "different plan" in r.output and "--allow-mixed" in r.output


def test_sweep_command_bad_plan(traj, tmp_path, runner):
    bad = tmp_path / "bad.toml"
    bad.write_text("[probes]\nloss = true\nsharpness = true\n")
    r = runner.invoke(app, ["sweep", str(traj), "--out", str(tmp_path / "x.sqlite"), "--plan", str(bad), "--quiet"])
    assert r.exit_code == 2
    from losslens.measure.probes.registry import PROBES

    assert f"unknown probe(s) ['sharpness']; valid probes: {', '.join(PROBES)}\n" in r.output
    bad.write_text('[probes]\nquant = ["rtn:9"]\n')
    r = runner.invoke(app, ["sweep", str(traj), "--out", str(tmp_path / "x.sqlite"), "--plan", str(bad), "--quiet"])
    assert r.exit_code == 2 and "invalid quantizer spec 'rtn:9'" in r.output
    r = runner.invoke(app, ["sweep", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.sqlite"), "--quiet"])
    assert r.exit_code == 2 and "does not exist" in r.output


def test_correlate_command(traj, tmp_path, runner):
    plan = Plan.from_file(tiny_plan_toml(tmp_path / "p.toml", traj, probes=CHEAP))
    one = tmp_path / "one.sqlite"
    run_sweep(traj, plan.replace(checkpoints=("step-000100",)), out=one, progress=False, num_threads=1)
    r = runner.invoke(app, ["correlate", str(one), "--x", "trace", "--y", "rtn:4"])
    assert r.exit_code == 1 and "a trajectory of 1 checkpoint cannot be correlated" in r.output
    full = tmp_path / "full.sqlite"
    run_sweep(traj, plan, out=full, progress=False, num_threads=1)
    r = runner.invoke(
        app,
        [
            "correlate",
            str(full),
            "--x",
            "trace",
            "--y",
            "rtn:4:g128",
            "--method",
            "spearman",
            "--control",
            "lr",
            "--n-boot",
            "50",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert [x["controls"] for x in rows] == ["", "lr"]
    assert rows[0]["n"] == N_CKPT and -1 <= rows[0]["r"] <= 1
    r = runner.invoke(app, ["correlate", str(full), "--x", "sharpness"])
    assert r.exit_code == 2 and "unknown series 'sharpness'" in r.output
    r = runner.invoke(app, ["correlate", str(tmp_path / "missing.sqlite")])
    assert r.exit_code == 2 and "no results store" in r.output
    with Store(full) as st:
        assert st.count("ok") == 3 * N_CKPT


def test_strict_memory_changes_the_allocator_not_the_numbers(traj, runner):
    """``--strict-memory`` (glibc's 64 kB mmap threshold, process-wide: so in a subprocess) gives the
    same trace and eigenvalue, bit for bit, as the default allocator."""
    import os
    import subprocess
    import sys

    from losslens.geometry.memory.allocator import _libc

    if not sys.platform.startswith("linux") or _libc() is None:
        pytest.skip("--strict-memory needs glibc's malloc")
    args = [
        "sharpness",
        str(traj / "step-000200"),
        "--num-matvecs",
        "3",
        "--data",
        str(traj / "data" / "curvature.safetensors"),
        "--threads",
        "1",
        "--max-iter",
        "5",
        "--json",
    ]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    plain = json.loads(r.output[r.output.index("{") :])
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, "-m", "losslens", *args, "--strict-memory"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    strict = json.loads(done.stdout[done.stdout.index("{") :])
    assert strict["trace"]["value"] == plain["trace"]["value"]
    assert strict["eigen"]["values"] == plain["eigen"]["values"]


def test_sharpness_command_json(traj, runner):
    data = traj / "data" / "curvature.safetensors"
    r = runner.invoke(
        app,
        [
            "sharpness",
            str(traj / "step-000200"),
            "--num-matvecs",
            "3",
            "--method",
            "hutch++",
            "--data",
            str(data),
            "--threads",
            "1",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{") :])
    assert out["checkpoint"] == "step-000200" and out["trace"]["num_matvecs"] == 3
    assert out["trace"]["ci_low"] <= out["trace"]["value"] <= out["trace"]["ci_high"]
    assert len(out["eigen"]["values"]) == 1 and out["dim"] > 0 and out["trace"]["seconds"] > 0
    assert out["eigen"]["method"] == "lanczos" and len(out["eigen"]["residuals"]) == 1  # the default (#23)
    from losslens.measure.probes.eigen import EigenProbe

    assert EigenProbe().method == "lanczos"
    r = runner.invoke(app, ["sharpness", str(traj), "--label", "step-000999", "--data", str(data)])
    assert r.exit_code == 2 and "step-000999" in r.output


def test_sweep_prints_one_warning_line_for_rows_whose_measured_error_is_over_tolerance(traj, tmp_path, runner):
    """bf16 weights with bf16 compute and gradient differences (issue #35): the rows carry
    error_warning and the sweep says so in one warning line; the default float32 compute does not."""
    plan = tiny_plan_toml(tmp_path / "plan.toml", traj, probes='trace = { method = "hutchinson", num_matvecs = 2 }\n')
    base = ["sweep", str(traj), "--plan", str(plan), "--quiet", "--threads", "1", "--dtype", "bfloat16"]
    base += ["--backend", "difference"]
    half = runner.invoke(app, [*base, "--out", str(tmp_path / "half.sqlite"), "--compute-dtype", "bfloat16"])
    assert half.exit_code == 0, half.output
    warnings = [ln for ln in half.output.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and f"{N_CKPT} row(s)" in warnings[0] and "bfloat16" in warnings[0], half.output
    default = runner.invoke(app, [*base, "--out", str(tmp_path / "default.sqlite")])
    assert default.exit_code == 0 and "warning:" not in default.output, default.output
