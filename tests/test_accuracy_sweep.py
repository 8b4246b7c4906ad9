"""The accuracy probe in sweeps: rows per variant and task, paired with FP, resumable, failures per task (#28)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("lm_eval")

from losslens.measure.accuracy import TASK_NAME, task_accuracy
from losslens.study.analysis import series
from losslens.lm.checkpoints import CheckpointLoader, Trajectory
from losslens.lm.data import load_tokenizer
from losslens.study.sweep import AccuracyProbe, DataSpec, Plan, PlanError, Store, run_sweep
from tests.fixtures_trajectory import tiny_trajectory_dir

SPEC = "rtn:2:g32"


@pytest.fixture(scope="module")
def traj():
    return Trajectory.from_folder(tiny_trajectory_dir(seq_len=64))


def _plan(tasks=("embedded",), **kw):
    return Plan(
        loss=True,
        quant=(SPEC,),
        lawa=(2,),
        accuracy=AccuracyProbe(tasks=tasks, specs=(SPEC,), limit=20, n_boot=100, **kw),
        data=DataSpec(eval=(1, 4, 64), calibration=(1, 4, 64), curvature=(1, 2, 64)),
    )


def test_accuracy_rows_match_the_function_and_resume(traj, tmp_path):
    out = tmp_path / "r.sqlite"
    plan = _plan()
    keys = [t.spec for t in plan.tasks() if t.probe == "accuracy"]
    q = plan.accuracy.specs[0]  # the canonical spec string
    assert keys == ["fp", f"fp@{TASK_NAME}", q, f"{q}@{TASK_NAME}"]
    rep = run_sweep(traj, plan, out=out, progress=False)
    assert rep.n_failed == 0 and rep.n_ok == (len(traj) + 1) * 6
    with Store(out) as st:
        df = st.results()
    acc = df[df["probe"] == "accuracy"]
    last = str(traj[-1].label)
    spec = q
    direct = task_accuracy(
        CheckpointLoader(traj).load(traj[-1]), load_tokenizer(traj[-1]), "embedded", specs=[SPEC], limit=20, n_boot=100
    )
    fp = direct.scores["fp"][TASK_NAME]

    def val(s, m):
        return float(acc[(acc["checkpoint"] == last) & (acc["spec"] == s) & (acc["metric"] == m)]["value"].iloc[0])

    assert val(f"fp@{TASK_NAME}", "acc") == pytest.approx(fp.acc)
    assert val("fp", "acc") == pytest.approx(fp.acc)  # one task: the mean is the task
    assert val(spec, "delta_acc") == pytest.approx(direct.deltas[SPEC][TASK_NAME].delta)
    assert val(f"{spec}@{TASK_NAME}", "rel_drop") == pytest.approx(direct.deltas[SPEC][TASK_NAME].rel_drop, nan_ok=True)
    s = series(df, f"accuracy/{SPEC}/delta_acc")  # correlate's series key for Δacc
    assert len(s) == len(traj) and np.isfinite(s.to_numpy()).all()
    assert np.allclose(series(df, f"delta_acc:{SPEC}").to_numpy(), s.to_numpy())
    from losslens.study.analysis.accuracy_verdict import accuracy_verdict
    from losslens.study.report.accuracy_figures import accuracy_pairs
    from losslens.study.report.pages import build_report

    pairs = accuracy_pairs(df)
    assert len(pairs) == len(traj) + 1 and set(pairs["spec"]) == {q}  # + the LAWA checkpoint (its tokenizer: the run's)
    v = accuracy_verdict(df, q, n_boot=200)
    assert v["answer"] in ("yes", "no", "not resolved") and "Spearman" in v["text"]
    assert v["n"] == len(traj) or "constant" in v["text"]
    page = build_report(df, tmp_path / "report.html").read_text()
    assert (
        "Loss vs task accuracy" in page
        and 'data-figure="loss_vs_accuracy"' in page
        and "Does task accuracy fall" in page
    )
    again = run_sweep(traj, plan, out=out, progress=False)  # resumable: nothing recomputed
    assert again.n_run == 0 and again.n_skipped == (len(traj) + 1) * 6


def test_an_uncached_task_fails_its_rows_only(traj, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "empty"))
    y = tmp_path / "remote.yaml"
    y.write_text(
        "task: remote_never_cached\ndataset_path: losslens-test/never-cached-xyz\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: q\ndoc_to_choice: ['a', 'b']\ndoc_to_target: 0\n"
    )
    plan = Plan(
        loss=False,
        accuracy=AccuracyProbe(tasks=("embedded", str(y)), limit=10, n_boot=0),
        data=DataSpec(eval=(1, 4, 64), calibration=(1, 4, 64), curvature=(1, 2, 64)),
        checkpoints=(str(traj[0].label),),
    )
    rep = run_sweep(traj, plan, out=tmp_path / "r.sqlite", progress=False)
    failed = {(p, s): e for _, p, s, e in rep.failures}
    assert set(failed) == {("accuracy", "fp@remote_never_cached"), ("accuracy", "fp")}
    assert "HF_DATASETS_OFFLINE=1" in failed[("accuracy", "fp@remote_never_cached")] and rep.n_ok == 1


def test_accuracy_settings_are_validated():
    with pytest.raises(PlanError, match="limit"):
        AccuracyProbe(limit=0)
    with pytest.raises(PlanError, match="does not exist"):
        Plan(accuracy=AccuracyProbe(tasks=("/nonexistent/task.yaml",)))
    with pytest.raises(PlanError, match="invalid quantizer spec"):
        Plan(accuracy=AccuracyProbe(specs=("rtn:99",)))
    assert Plan.from_dict({"probes": {"accuracy": {"tasks": ["embedded"], "limit": 5}}}).accuracy.limit == 5
    assert Plan().hash == Plan(accuracy=None).hash


def test_cli_accuracy_json(traj):
    import json

    from typer.testing import CliRunner

    from losslens.cli.app import app

    ck = traj[-1].location
    res = CliRunner().invoke(
        app, ["accuracy", str(ck), "--tasks", "embedded", "--spec", SPEC, "--limit", "12", "--n-boot", "50", "--json"]
    )
    assert res.exit_code == 0, res.output
    recs = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    by = {(r["variant"], r["task"]): r for r in recs}
    assert by[("fp", TASK_NAME)]["n"] == 12 and "delta_acc" in by[(f"{SPEC}", "mean")]
    bad = CliRunner().invoke(app, ["accuracy", str(ck), "--tasks", "/nonexistent/x.yaml"])
    assert bad.exit_code == 2 and "does not exist" in bad.output


@pytest.mark.parametrize("sign,answer", [(-1.0, "yes"), (1.0, "no")])
def test_accuracy_verdict_says_whether_accuracy_falls_where_dq_rises(sign, answer):
    """4 runs where Δacc follows ΔQ (plus noise): the within-run interval over the runs excludes 0.
    One run of 10 trending checkpoints: any two monotone trends rank-correlate perfectly, so one run
    does not resolve it (issue 37; this used to answer from a bootstrap over one run's checkpoints)."""
    import numpy as np
    import pandas as pd

    from losslens.study.analysis.accuracy_verdict import accuracy_verdict
    from losslens.study.report.figures import synthetic_results

    df = synthetic_results(n_checkpoints=10, specs=("rtn:4:g128",), runs=("r0", "r1", "r2", "r3"))
    q = df[(df["probe"] == "quant") & (df["metric"] == "rel_loss_error")].copy()
    v = q["value"].astype(float)
    noise = np.random.default_rng(0).normal(scale=0.3 * float(v.std()), size=len(v))
    acc = q.assign(probe="accuracy", metric="delta_acc", value=sign * 3 * v + noise)
    verdict = accuracy_verdict(pd.concat([df, acc], ignore_index=True), n_boot=300)
    assert verdict["answer"] == answer and verdict["n"] == int((~q["derived"].astype(bool)).sum())
    assert "run-level t" in verdict["text"]
    one = synthetic_results(n_checkpoints=10, specs=("rtn:4:g128",))
    q1 = one[(one["probe"] == "quant") & (one["metric"] == "rel_loss_error")].copy()
    acc1 = q1.assign(probe="accuracy", metric="delta_acc", value=sign * 3 * q1["value"].astype(float))
    single = accuracy_verdict(pd.concat([one, acc1], ignore_index=True), n_boot=300)
    assert single["answer"] == "not resolved" and "descriptive" in single["text"]
