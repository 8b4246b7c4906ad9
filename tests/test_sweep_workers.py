"""The local executor on several worker processes (issue #14, item 4): the rows of a one-process
run bit for bit, failures as failed rows, a killed worker, the worker count and its memory check,
and the pool underneath. (SIGKILL of the whole sweep and Ctrl-C with workers: test_sweep_resume.py.)"""

from __future__ import annotations

import operator
import os
import signal

import pandas as pd
import pytest
from typer.testing import CliRunner

from losslens.cli.app import app
from losslens.lm.core import workers as pool_mod
from losslens.lm.core import worker_loop
from losslens.lm.core.worker_loop import WorkerError
from losslens.lm.core.workers import WorkerPool
from losslens.study.sweep import Plan, Store, run_sweep
from losslens.study.sweep import local_workers
from losslens.study.sweep.testing import tiny_plan_toml, tiny_trajectory

N_CKPT = 4
EVERY_PROBE = (
    'loss = true\nquant = ["rtn:4", "int8", "gptq:3"]\ntrace = { method = "hutch++", num_matvecs = 6 }\n'
    'eigen = { k = 1, method = "lanczos", max_iter = 8 }\ndirectional = ["rtn:4"]\nkurtosis = true\n'
    'block_trace = { groups = "block", num_matvecs = 4 }\n'
    'explain = { specs = ["rtn:4"], blocks = ["layer"], trace_matvecs = 6 }\n'
)
# the trace: ~1 s per checkpoint
CHEAP = 'loss = true\nquant = ["rtn:4"]\ntrace = { method = "hutchinson", num_matvecs = 300 }\n'
SAME = [
    "run",
    "checkpoint",
    "step",
    "tokens",
    "lr",
    "derived",
    "probe",
    "spec",
    "metric",
    "value",
    "stderr",
    "ci_low",
    "ci_high",
    "n_hvp",
    "status",
    "error",
    "seed",
    "data_hash",
    "converged",
    "threads",
    "plan_hash",
    "config_hash",
]


@pytest.fixture(scope="module")
def traj(tmp_path_factory):
    """A tiny trajectory whose third checkpoint's weights are damaged (its rows fail in both runs)."""
    folder = tiny_trajectory(tmp_path_factory.mktemp("workers") / "tiny", n=N_CKPT, seed=5)
    (folder / "step-000300" / "model.safetensors").write_bytes(b"not a safetensors file")
    return folder


def _results(path) -> pd.DataFrame:
    with Store(path) as st:
        return st.results()


def _raw(path) -> pd.DataFrame:
    with Store(path) as st:
        return st.raw().sort_values(["checkpoint", "probe", "spec"]).reset_index(drop=True)


def test_two_workers_write_the_rows_of_one_process_bit_for_bit(traj, tmp_path, monkeypatch):
    plan = Plan.from_file(tiny_plan_toml(tmp_path / "p.toml", traj, probes=EVERY_PROBE))
    one, two = tmp_path / "one.sqlite", tmp_path / "two.sqlite"
    r1 = run_sweep(traj, plan, out=one, progress=False, num_threads=1, num_workers=1)

    def not_here(*_a, **_k):
        raise AssertionError("with workers no checkpoint is loaded in the parent process")

    monkeypatch.setattr("losslens.study.sweep.executors.get_loader", not_here)  # the workers load their own models
    r2 = run_sweep(traj, plan, out=two, progress=False, num_threads=1, num_workers=2)
    assert (r1.workers, r2.workers) == (1, 2) and "2 workers" in str(r2)
    assert r1.n_failed == r2.n_failed == len(plan.tasks())  # the damaged checkpoint, as failed rows
    a, b = _results(one), _results(two)
    assert len(a) > 40 and (a.status == "ok").sum() > 30
    pd.testing.assert_frame_equal(a[SAME], b[SAME])  # same order, same values, bit for bit
    ra, rb = _raw(one), _raw(two)
    assert ra.metrics.tolist() == rb.metrics.tolist()
    failed = b[b.status == "failed"]
    assert set(failed.checkpoint) == {"step-000300"} and failed.error.str.contains("loading checkpoint").all()


def test_a_killed_worker_fails_the_rest_of_its_checkpoint_and_a_retry_completes(traj, tmp_path):
    plan = Plan.from_file(tiny_plan_toml(tmp_path / "p.toml", traj, probes=CHEAP))
    ref = tmp_path / "ref.sqlite"
    run_sweep(traj, plan, out=ref, progress=False, num_threads=1, num_workers=1)
    out = tmp_path / "r.sqlite"
    with WorkerPool(2, threads=1) as pool:
        killed = []

        def kill_once(row):
            if not killed:  # the sender of the first row is in the middle of its checkpoint: kill every worker
                killed.extend(pool.pids)
                for pid in killed:
                    os.kill(pid, signal.SIGKILL)

        rep = run_sweep(traj, plan, out=out, progress=False, pool=pool, on_row=kill_once)
        assert pool.size == 2 and not set(pool.pids) & set(killed)  # replaced
        assert rep.workers == 2
    assert rep.exit_code == 1 and rep.n_failed >= 2
    lost = [e for c, p, s, e in rep.failures if c != "step-000300"]
    assert lost and all("was killed by SIGKILL" in e and "use fewer workers" in e for e in lost)
    raw = _raw(out)
    assert not raw.duplicated(["checkpoint", "probe", "spec"]).any() and len(raw) == N_CKPT * len(plan.tasks())
    again = run_sweep(traj, plan, out=out, progress=False, num_threads=1, num_workers=1, retry_failed=True)
    assert again.n_ok == len(lost)
    a, b = _results(ref), _results(out)
    pd.testing.assert_frame_equal(a[SAME], b[SAME])


def test_the_default_worker_count(monkeypatch):
    monkeypatch.setattr(local_workers, "available_cores", lambda: 4)
    monkeypatch.delenv(local_workers.ENV_WORKERS, raising=False)
    assert local_workers.resolve_workers(None, 20) == (4, 1)  # one per core, one thread each
    assert local_workers.resolve_workers(None, 3) == (3, 1)  # never more than the checkpoints
    assert local_workers.resolve_workers(None, 1) == (1, None)  # one checkpoint: this process, torch's threads
    assert local_workers.resolve_workers(None, 20, "cuda") == (1, None)  # one GPU
    assert local_workers.resolve_workers(None, 20, "cuda:0", 2) == (1, 2)
    assert local_workers.resolve_workers(None, 20, None, 2) == (2, 2)  # threads given: the cores shared out
    assert local_workers.resolve_workers(2, 20) == (2, 2)
    monkeypatch.setenv(local_workers.ENV_WORKERS, "3")
    assert local_workers.resolve_workers(None, 20) == (3, 1)
    for bad in ("0", "two"):
        monkeypatch.setenv(local_workers.ENV_WORKERS, bad)
        with pytest.raises(WorkerError, match="LOSSLENS_WORKERS must be a positive integer"):
            local_workers.resolve_workers(None, 20)
    with pytest.raises(WorkerError, match="integer >= 1"):
        local_workers.resolve_workers(0, 20)


def test_workers_whose_models_exceed_the_memory_are_refused_or_lowered(traj, tmp_path, monkeypatch):
    import losslens.geometry.memory.budget
    from losslens.lm.checkpoints import Trajectory, load_model
    from losslens.lm.checkpoints.files import weights_bytes

    size = weights_bytes(Trajectory.from_folder(traj)[0])
    assert size == 4 * sum(p.numel() for p in load_model(traj / "step-000100").parameters())  # float32, from the header
    monkeypatch.setattr(losslens.geometry.memory.budget, "available_bytes", lambda device: int(2.5 * size))
    plan = tiny_plan_toml(tmp_path / "p.toml", traj, probes="loss = true\n")
    out = tmp_path / "r.sqlite"

    def sweep(*extra):
        return CliRunner().invoke(app, ["sweep", str(traj), "--out", str(out), "--plan", str(plan), "--quiet", *extra])

    for bad, message in (
        (["--workers", "3"], "error: 3 workers each hold their own copy of the model"),
        (["--workers", "0"], "--workers"),
    ):
        r = sweep(*bad)
        assert r.exit_code == 2 and message in r.output, r.output
    assert "use --workers 2 (num_workers=2) or fewer" in sweep("--workers", "3").output
    assert not out.exists()  # refused before the store and the data
    monkeypatch.setattr(local_workers, "available_cores", lambda: 4)
    monkeypatch.delenv(local_workers.ENV_WORKERS)
    r = sweep("--threads", "1")  # the default (4 cores) is lowered to what fits, not refused
    assert r.exit_code == 1, r.output  # 1: the damaged checkpoint's row failed
    assert "(local, 2 workers)" in r.output and "running 2 worker(s)" in r.output


# ----------------------------------------------------------------------------------------- the pool
def test_pool_events_errors_lost_workers_and_reuse():
    with WorkerPool(2, threads=1) as pool:
        events = list(pool.run([(operator.add, (i,)) for i in range(5)], context=10))
        assert sorted((e.job, e.kind, e.value) for e in events) == [(i, "done", 10 + i) for i in range(5)]
        (err,) = pool.run([(operator.truediv, (0,))], context=1)
        assert err.kind == "error" and err.value.startswith("ZeroDivisionError: division by zero")
        before = pool.pids
        lost = list(pool.run([(signal.raise_signal, ())], context=signal.SIGKILL))  # the job kills its worker
        assert [(e.kind, "was killed by SIGKILL" in e.value) for e in lost] == [("lost", True)]
        assert pool.size == 2 and pool.pids != before
        assert [e.value for e in pool.run([(operator.mul, (3,))], context=2)] == [6]  # the replacement works
    with pytest.raises(WorkerError, match="only inside|for jobs running"):
        worker_loop.emit("x")
    with pytest.raises(WorkerError, match="integer >= 1"):
        WorkerPool(0)


def test_cores_respect_a_cgroup_cpu_quota(tmp_path):
    assert pool_mod._cgroup_cpus(str(tmp_path)) is None  # no cgroup files: unknown
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert pool_mod._cgroup_cpus(str(tmp_path)) is None  # v2, unlimited
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert pool_mod._cgroup_cpus(str(tmp_path)) == 2  # 1.5 CPUs: 2 workers' worth
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert pool_mod._cgroup_cpus(str(tmp_path)) == 4  # v1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert pool_mod._cgroup_cpus(str(tmp_path)) is None
    assert 1 <= pool_mod.available_cores() <= (os.cpu_count() or 1)
