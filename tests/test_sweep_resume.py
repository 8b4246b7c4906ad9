"""Resume after a real SIGKILL of a `losslens sweep` subprocess: no lost, duplicated or changed rows."""
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

from probes.sweep import Plan, Store, run_sweep
from probes.sweep.testing import tiny_plan_toml, tiny_trajectory

REPO = Path(__file__).resolve().parents[1]
CHEAP = 'loss = true\nquant = ["rtn:4", "int8"]\nkurtosis = true\ntrace = { method = "hutchinson", num_matvecs = 2 }\n'
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
        ["checkpoint", "probe", "spec", "metric", "value", "stderr", "status"]]


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
    return [sys.executable, "-m", "probes.sweep", *map(str, args)]


@pytest.mark.timeout(240)
def test_sigkill_mid_sweep_then_resume(traj, tmp_path):
    plan_file = tiny_plan_toml(tmp_path / "plan.toml", traj, probes=CHEAP)
    total = N_CKPT * ROWS_PER_CKPT
    # reference: one uninterrupted in-process run
    ref_out = tmp_path / "ref.sqlite"
    run_sweep(traj, Plan.from_file(plan_file), out=ref_out, progress=False, num_threads=1)
    # a real subprocess, killed with SIGKILL once a few rows are committed
    out = tmp_path / "killed.sqlite"
    cmd = _cli("sweep", traj, "--out", out, "--plan", plan_file, "--quiet", "--threads", "1")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and proc.poll() is None and _count(out) < 3:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    log = proc.communicate(timeout=30)[0].decode(errors="replace")
    assert proc.returncode == -signal.SIGKILL, f"the sweep was not killed mid-run (rc={proc.returncode}):\n{log[-2000:]}"
    n_before = _count(out)
    assert 3 <= n_before < total
    before = _key_values(_tidy(out))
    # rerun: finishes the rest, skips what was committed
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"{n_before} already done" in done.stdout and f"{total - n_before} ok" in done.stdout
    assert "correlations across checkpoints" in done.stdout
    con = sqlite3.connect(out)
    dup = con.execute("SELECT checkpoint, probe, spec, COUNT(*) FROM results GROUP BY 1, 2, 3 HAVING COUNT(*) > 1").fetchall()
    n_after = con.execute("SELECT COUNT(*) FROM results").fetchone()[0]
    con.close()
    assert dup == [] and n_after == total
    got, want = _key_values(_tidy(out)), _key_values(_tidy(ref_out))
    assert len(got) == len(want) and (got.status == "ok").all()
    pd.testing.assert_frame_equal(got[["checkpoint", "probe", "spec", "metric"]], want[["checkpoint", "probe", "spec", "metric"]])
    np.testing.assert_allclose(got.value.to_numpy(), want.value.to_numpy(), rtol=1e-5, atol=1e-7)
    # rows committed before the kill were kept as they were
    merged = before.merge(got, on=["checkpoint", "probe", "spec", "metric"], suffixes=("_b", "_a"))
    assert len(merged) == len(before) and np.array_equal(merged.value_b.to_numpy(), merged.value_a.to_numpy())
