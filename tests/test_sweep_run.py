"""Sweeps on a tiny real trajectory (in-process): values, resume, failures, mixed plans, LAWA, curvature probes."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from losslens.study.sweep import Plan, PlanError, Store, StoreError, run_sweep
from losslens.study.sweep.testing import tiny_plan_toml, tiny_token_sets, tiny_trajectory

CHEAP = 'loss = true\nquant = ["rtn:4", "int8"]\nkurtosis = true\ntrace = { method = "hutchinson", num_matvecs = 2 }\n'
N_CKPT = 4
ROWS_PER_CKPT = 5


@pytest.fixture(scope="module")
def traj(tmp_path_factory):
    return tiny_trajectory(tmp_path_factory.mktemp("traj") / "tiny", n=N_CKPT, seed=0)


@pytest.fixture(scope="module")
def cheap_plan(traj, tmp_path_factory):
    return Plan.from_file(tiny_plan_toml(tmp_path_factory.mktemp("plan") / "plan.toml", traj, probes=CHEAP))


def _tidy(path) -> pd.DataFrame:
    with Store(path) as st:
        return st.results()


def _key_values(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(["checkpoint", "probe", "spec", "metric"]).reset_index(drop=True)[
        ["checkpoint", "probe", "spec", "metric", "value", "stderr", "status"]
    ]


def test_local_sweep_values_resume_and_mixed(traj, cheap_plan, tmp_path):
    out = tmp_path / "r.sqlite"
    rep = run_sweep(traj, cheap_plan, out=out, progress=False, num_threads=1)
    assert (rep.n_ok, rep.n_failed, rep.n_skipped) == (N_CKPT * ROWS_PER_CKPT, 0, 0)
    df = _tidy(out)
    assert (df.status == "ok").all() and df.value.notna().all()
    assert df.lr.notna().all() and list(df.drop_duplicates("checkpoint").step) == [100, 200, 300, 400]
    # the FP loss equals a direct evaluation; rel_loss_error is consistent with q_loss
    from losslens.lm.checkpoints import CheckpointLoader, Trajectory
    from losslens.lm.core.next_token_loss import evaluate

    tr = Trajectory.from_folder(traj)
    sets = tiny_token_sets(traj)
    model = CheckpointLoader(tr).load(tr[1])
    want = evaluate(model, sets["eval"]).loss
    c1 = df[df.checkpoint == tr[1].label].set_index(["probe", "spec", "metric"])["value"]
    assert c1[("loss", "", "loss")] == pytest.approx(want, rel=1e-6)
    assert c1[("quant", "rtn:4:g128", "rel_loss_error")] == pytest.approx(
        c1[("quant", "rtn:4:g128", "q_loss")] / want - 1, rel=1e-6
    )
    assert c1[("loss", "", "ppl")] == pytest.approx(math.exp(want), rel=1e-6)
    tr_rows = df[df.probe == "trace"]
    assert (tr_rows.n_hvp == 2).all() and tr_rows.stderr.notna().all()
    with Store(out) as st:
        assert st.meta["plan_hash"] == cheap_plan.hash and len(st.meta["data_hash"]) == 64
        assert set(st.meta["data_hashes"]) == {"eval", "calibration", "curvature"}
    # a rerun of the same plan does nothing
    again = run_sweep(traj, cheap_plan, out=out, progress=False, num_threads=1)
    assert (again.n_run, again.n_skipped) == (0, N_CKPT * ROWS_PER_CKPT)
    # another plan is refused ...
    bigger = cheap_plan.replace(quant=cheap_plan.quant + ("rtn:3",))
    with pytest.raises(StoreError, match="different plan"):
        run_sweep(traj, bigger, out=out, progress=False, num_threads=1)
    # ... unless mixing is allowed: only the new spec runs
    mixed = run_sweep(traj, bigger, out=out, progress=False, num_threads=1, allow_mixed=True)
    assert (mixed.n_run, mixed.n_ok) == (N_CKPT, N_CKPT)
    assert len(_tidy(out)) == len(df) + 3 * N_CKPT


def test_probe_failure_is_isolated_and_retried_on_request(traj, cheap_plan, tmp_path, monkeypatch):
    from losslens.study.sweep import runner

    def boom(st, task):
        raise RuntimeError("kurtosis exploded")

    monkeypatch.setitem(runner.PROBE_FUNCS, "kurtosis", boom)
    plan = cheap_plan.replace(checkpoints=(Path(traj, "step-000100").name,))
    out = tmp_path / "r.sqlite"
    rep = run_sweep(traj, plan, out=out, progress=False, num_threads=1)
    assert (rep.n_ok, rep.n_failed) == (ROWS_PER_CKPT - 1, 1)
    df = _tidy(out)
    bad = df[df.status == "failed"]
    assert list(bad.probe) == ["kurtosis"] and "RuntimeError: kurtosis exploded" in bad.error.iloc[0]
    assert run_sweep(traj, plan, out=out, progress=False, num_threads=1).n_run == 0
    monkeypatch.undo()
    fixed = run_sweep(traj, plan, out=out, progress=False, num_threads=1, retry_failed=True)
    assert (fixed.n_run, fixed.n_ok) == (1, 1)
    assert (_tidy(out).status == "ok").all()


def test_corrupt_checkpoint_recorded_as_failed(traj, cheap_plan, tmp_path):
    bad = tmp_path / "traj"
    shutil.copytree(traj, bad)
    (bad / "step-000200" / "model.safetensors").write_bytes(b"\x00garbage" * 64)
    plan = cheap_plan  # token-set files still point at the original folder: same data
    out = tmp_path / "r.sqlite"
    rep = run_sweep(bad, plan, out=out, progress=False, num_threads=1)
    assert rep.n_failed == ROWS_PER_CKPT and rep.n_ok == (N_CKPT - 1) * ROWS_PER_CKPT
    df = _tidy(out)
    failed = df[df.status == "failed"]
    assert set(failed.checkpoint) == {"step-000200"}
    assert failed.error.str.contains("loading checkpoint 'step-000200' failed").all()
    assert (df[df.checkpoint != "step-000200"].status == "ok").all()
    # the checkpoints after the corrupt one finished
    assert set(df[df.status == "ok"].checkpoint) == {"step-000100", "step-000300", "step-000400"}
    retry = run_sweep(bad, plan, out=out, progress=False, num_threads=1, retry_failed=True)
    assert (retry.n_run, retry.n_failed) == (ROWS_PER_CKPT, ROWS_PER_CKPT)


def test_curvature_probes_lawa_and_blocks(traj, tmp_path):
    plan = Plan(
        loss=True,
        eigen={"k": 1, "method": "power", "max_iter": 3},
        block_trace={"groups": "block", "num_matvecs": 2},
        directional=("rtn:4",),
        lawa=(2,),
        checkpoints=("step-000400", "lawa2@step-000400"),
        data={"eval": (2, 2, 16), "calibration": (2, 2, 16), "curvature": (1, 2, 16)},
    )
    out = tmp_path / "r.sqlite"
    rep = run_sweep(traj, plan, out=out, progress=False, num_threads=1, token_sets=tiny_token_sets(traj))
    assert rep.n_failed == 0, rep.failures
    df = _tidy(out)
    assert set(df.checkpoint) == {"step-000400", "lawa2@step-000400"}
    lawa = df[df.checkpoint == "lawa2@step-000400"]
    assert lawa.derived.all() and (lawa.step == 400).all()
    assert not df[df.checkpoint == "step-000400"].derived.any()
    blocks = df[(df.probe == "block_trace") & (df.checkpoint == "step-000400")]
    assert list(blocks.spec) == ["block0", "block1", "other"] and (blocks.metric == "trace").all()
    d = df[(df.probe == "directional") & (df.checkpoint == "step-000400")].set_index("metric")["value"]
    assert d["pred_delta"] == pytest.approx(d["gTd"] + 0.5 * d["dHd"], rel=1e-9)
    # second order prediction close to the measured change for a small (4-bit) step
    assert abs(d["pred_delta"] - d["actual_delta"]) < 0.2 * abs(d["actual_delta"]) + 1e-4
    assert df[(df.probe == "eigen")].metric.unique().tolist() == ["lambda_1"]
    with pytest.raises(PlanError, match="unknown label"):
        run_sweep(
            traj,
            plan.replace(checkpoints=("nope",)),
            out=tmp_path / "x.sqlite",
            progress=False,
            num_threads=1,
            token_sets=tiny_token_sets(traj),
        )
