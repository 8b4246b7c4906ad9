"""Resume after a real SIGKILL (or Ctrl-C) of a `losslens sweep` subprocess, in one process or with
worker processes: no lost, duplicated or changed rows, no worker left running."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from losslens.study.sweep import Plan, Store, run_sweep
from losslens.study.sweep.testing import tiny_plan_toml, tiny_trajectory

REPO = Path(__file__).resolve().parents[1]
CHEAP = 'loss = true\nquant = ["rtn:4", "int8"]\nkurtosis = true\ntrace = { method = "hutchinson", num_matvecs = 2 }\n'
SLOWER = CHEAP.replace("num_matvecs = 2", "num_matvecs = 150")  # with workers: ~0.5 s per checkpoint, time to kill
N_CKPT = 4
ROWS_PER_CKPT = 5


@pytest.fixture(scope="module")
def traj(tmp_path_factory):
    return tiny_trajectory(tmp_path_factory.mktemp("traj") / "tiny", n=N_CKPT, seed=0)


def _tidy(path) -> pd.DataFrame:
    with Store(path) as st:
        return st.results()


def _key_values(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(["checkpoint", "probe", "spec", "metric"]).reset_index(drop=True)[
        ["checkpoint", "probe", "spec", "metric", "value", "stderr", "status"]
    ]


def _count(path: Path) -> int:
    if not path.exists():
        return 0
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
        try:
            return con.execute("SELECT COUNT(*) FROM results").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def _cli(*args) -> list[str]:
    return [sys.executable, "-m", "losslens", *map(str, args)]


def _children(pid: int) -> list:
    import psutil

    return psutil.Process(pid).children(recursive=True)


def _gone(procs, timeout: float = 20.0) -> list:
    import psutil

    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return alive


@pytest.mark.timeout(240)
@pytest.mark.parametrize("workers", [1, 2])
def test_sigkill_mid_sweep_then_resume(traj, tmp_path, workers):
    plan_file = tiny_plan_toml(tmp_path / "plan.toml", traj, probes=CHEAP if workers == 1 else SLOWER)
    total = N_CKPT * ROWS_PER_CKPT
    # reference: one uninterrupted in-process run
    ref_out = tmp_path / "ref.sqlite"
    run_sweep(traj, Plan.from_file(plan_file), out=ref_out, progress=False, num_threads=1)
    # a real subprocess, killed with SIGKILL once a few rows are committed
    out = tmp_path / "killed.sqlite"
    cmd = _cli("sweep", traj, "--out", out, "--plan", plan_file, "--quiet", "--threads", "1", "--workers", workers)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and proc.poll() is None and _count(out) < 3:
        time.sleep(0.01)
    children = _children(proc.pid) if proc.poll() is None else []
    proc.send_signal(signal.SIGKILL)
    log = proc.communicate(timeout=30)[0].decode(errors="replace")
    assert proc.returncode == -signal.SIGKILL, (
        f"the sweep was not killed mid-run (rc={proc.returncode}):\n{log[-2000:]}"
    )
    assert len(children) == (workers if workers > 1 else 0)
    assert _gone(children) == []  # the workers die with the sweep, they do not compute on
    n_before = _count(out)
    assert 3 <= n_before < total
    before = _key_values(_tidy(out))
    # rerun: finishes the rest, skips what was committed
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"{n_before} already done" in done.stdout and f"{total - n_before} ok" in done.stdout
    assert "correlations across checkpoints" in done.stdout
    con = sqlite3.connect(out)
    dup = con.execute(
        "SELECT checkpoint, probe, spec, COUNT(*) FROM results GROUP BY 1, 2, 3 HAVING COUNT(*) > 1"
    ).fetchall()
    n_after = con.execute("SELECT COUNT(*) FROM results").fetchone()[0]
    con.close()
    assert dup == [] and n_after == total
    got, want = _key_values(_tidy(out)), _key_values(_tidy(ref_out))
    assert len(got) == len(want) and (got.status == "ok").all()
    pd.testing.assert_frame_equal(
        got[["checkpoint", "probe", "spec", "metric"]], want[["checkpoint", "probe", "spec", "metric"]]
    )
    np.testing.assert_allclose(got.value.to_numpy(), want.value.to_numpy(), rtol=1e-5, atol=1e-7)
    # rows committed before the kill were kept as they were
    merged = before.merge(got, on=["checkpoint", "probe", "spec", "metric"], suffixes=("_b", "_a"))
    assert len(merged) == len(before) and np.array_equal(merged.value_b.to_numpy(), merged.value_a.to_numpy())


@pytest.mark.timeout(240)
def test_ctrl_c_with_workers_keeps_every_finished_row_then_resumes(traj, tmp_path):
    from losslens.study.sweep.lock import lock_path

    plan_file = tiny_plan_toml(tmp_path / "plan.toml", traj, probes=SLOWER)
    total = N_CKPT * ROWS_PER_CKPT
    ref_out = tmp_path / "ref.sqlite"
    run_sweep(traj, Plan.from_file(plan_file), out=ref_out, progress=False, num_threads=1)
    out = tmp_path / "interrupted.sqlite"
    cmd = _cli("sweep", traj, "--out", out, "--plan", plan_file, "--quiet", "--threads", "1", "--workers", "2")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # its own process group, as a terminal's foreground job: Ctrl-C sends SIGINT to every process in it
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and proc.poll() is None and _count(out) < 3:
        time.sleep(0.01)
    children = _children(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    log = proc.communicate(timeout=60)[0].decode(errors="replace")
    assert proc.returncode == 130 and "error: interrupted" in log, log[-3000:]
    assert len(children) == 2 and _gone(children, 5.0) == []
    assert not lock_path(out).exists()
    n_before = _count(out)
    assert 3 <= n_before < total
    before = _key_values(_tidy(out))
    assert (before.status == "ok").all()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"{n_before} already done" in done.stdout and f"{total - n_before} ok" in done.stdout
    got, want = _key_values(_tidy(out)), _key_values(_tidy(ref_out))
    pd.testing.assert_frame_equal(got, want)  # bit for bit, no row twice
