"""The Ray executor on a local 2-CPU cluster gives the same rows as the in-process executor."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from losslens.study.sweep import Plan, Store, run_sweep
from losslens.study.sweep.testing import tiny_plan_toml, tiny_trajectory

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.timeout(300)
CHEAP = 'loss = true\nquant = ["rtn:4", "int8"]\ntrace = { method = "hutchinson", num_matvecs = 2 }\nkurtosis = true\n'


@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():
        ray.shutdown()
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    except Exception as exc:  # pragma: no cover - environment without the ability to start Ray
        pytest.skip(f"cannot start a local Ray cluster here: {exc}")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def traj(tmp_path_factory):
    return tiny_trajectory(tmp_path_factory.mktemp("traj") / "tiny", n=3, seed=2)


def _rows(path):
    with Store(path) as st:
        df = st.results()
    return df.sort_values(["checkpoint", "probe", "spec", "metric"]).reset_index(drop=True)


def test_ray_matches_local_and_records_failures(cluster, traj, tmp_path):
    plan = Plan.from_file(tiny_plan_toml(tmp_path / "plan.toml", traj, probes=CHEAP))
    local = run_sweep(traj, plan, out=tmp_path / "local.sqlite", progress=False, num_threads=1)
    remote = run_sweep(traj, plan, out=tmp_path / "ray.sqlite", progress=False, executor="ray")
    assert ray.is_initialized()  # a cluster the caller started is left running
    assert (local.n_ok, remote.n_ok, remote.n_failed) == (15, 15, 0)
    a, b = _rows(tmp_path / "local.sqlite"), _rows(tmp_path / "ray.sqlite")
    keys = ["checkpoint", "probe", "spec", "metric", "status", "n_hvp", "step", "lr"]
    assert a[keys].equals(b[keys])
    np.testing.assert_allclose(b.value.to_numpy(), a.value.to_numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(b.stderr.to_numpy(), a.stderr.to_numpy(), rtol=1e-4, atol=1e-7)
    assert (b.data_hash == a.data_hash).all()
    # a rerun on Ray skips everything
    assert run_sweep(traj, plan, out=tmp_path / "ray.sqlite", progress=False, executor="ray").n_run == 0
    # a corrupt checkpoint inside a Ray task: failed rows for it, the others finish
    bad = tmp_path / "bad"
    shutil.copytree(traj, bad)
    (bad / "step-000200" / "model.safetensors").write_bytes(b"broken" * 50)
    rep = run_sweep(bad, plan, out=tmp_path / "bad.sqlite", progress=False, executor="ray")
    assert (rep.n_ok, rep.n_failed) == (10, 5)
    df = _rows(tmp_path / "bad.sqlite")
    assert set(df[df.status == "failed"].checkpoint) == {"step-000200"}
    assert df[df.status == "failed"].error.str.contains("loading checkpoint").all()
