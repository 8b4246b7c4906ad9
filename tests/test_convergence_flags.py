"""Unconverged eigenvalues (issue #12, item 3): convergence is a first-class column of the store,
flagged in figures and the report, and left out of correlations unless asked (and counted)."""

from __future__ import annotations

import json
import sqlite3

import pandas as pd
import pytest
from typer.testing import CliRunner

from losslens.study.analysis import series, summary, unconverged
from losslens.cli.app import app
from losslens.study.report.figures import curvature_figure, synthetic_results
from losslens.study.report.pages import build_report
from losslens.study.report.scatter_figures import sharpness_vs_quant_figure
from losslens.study.sweep import Plan, Store, run_sweep
from losslens.study.sweep.testing import tiny_plan_toml, tiny_trajectory

N_CKPT = 4


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A sweep whose power iteration stops after one step (never converged) beside a Hutchinson
    trace (no tolerance: converged by definition) and the FP loss (no criterion)."""
    tmp = tmp_path_factory.mktemp("conv")
    traj = tiny_trajectory(tmp / "tiny", n=N_CKPT, seed=4)
    plan = tiny_plan_toml(
        tmp / "plan.toml",
        traj,
        probes=(
            'loss = true\nquant = ["rtn:4"]\ntrace = { method = "hutchinson", num_matvecs = 2 }\n'
            'eigen = { k = 2, method = "power", max_iter = 1 }\n'
        ),
    )
    out = tmp / "r.sqlite"
    run_sweep(traj, Plan.from_file(plan), out=out, progress=False, num_threads=1)
    return out


def test_the_store_has_a_converged_column(swept):
    with Store(swept) as st:
        raw = st.raw()
        df = st.results()
    by_probe = raw.groupby("probe")["converged"].apply(
        lambda s: set(s.dropna().astype(int)) if s.notna().any() else None
    )
    assert (
        by_probe["eigen"] == {0} and by_probe["trace"] == {1} and by_probe["loss"] is None and by_probe["quant"] is None
    )
    assert str(df["converged"].dtype) == "boolean"
    eig = df[df.probe == "eigen"]
    assert set(eig.metric) == {"lambda_1", "lambda_2"} and (eig.converged == False).all()  # noqa: E712
    assert (df[df.probe == "trace"].converged == True).all() and df[df.probe == "loss"].converged.isna().all()  # noqa: E712
    # the per-value flags agree with what the estimator reported (kept in extra as before)
    flags = [json.loads(e)["converged"] for e in raw[raw.probe == "eigen"].extra]
    assert all(f == [False, False] for f in flags)


def test_a_store_written_before_the_column_gains_it(tmp_path):
    path = tmp_path / "old.sqlite"
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE checkpoints (run TEXT NOT NULL DEFAULT '', label TEXT NOT NULL, position INTEGER NOT NULL,
            step INTEGER, tokens INTEGER, lr REAL, derived INTEGER NOT NULL DEFAULT 0, kind TEXT, location TEXT,
            ref_json TEXT,
            PRIMARY KEY (run, label));
        CREATE TABLE results (id INTEGER PRIMARY KEY AUTOINCREMENT, checkpoint TEXT NOT NULL, probe TEXT NOT NULL,
            spec TEXT NOT NULL, status TEXT NOT NULL, metrics TEXT NOT NULL DEFAULT '[]',
            extra TEXT NOT NULL DEFAULT '{}',
            n_hvp INTEGER NOT NULL DEFAULT 0, seconds REAL, error TEXT, seed INTEGER, data_hash TEXT, plan_hash TEXT,
            config_hash TEXT, run TEXT NOT NULL DEFAULT '', versions TEXT, created TEXT,
            UNIQUE (run, checkpoint, probe, spec));
    """)
    lam = [
        {"metric": f"lambda_{i}", "value": v, "stderr": None, "ci_low": None, "ci_high": None}
        for i, v in ((1, 5.0), (2, 3.0))
    ]
    con.execute(
        "INSERT INTO results(checkpoint, probe, spec, status, metrics, extra) "
        "VALUES ('s1', 'eigen', 'top2', 'ok', ?, ?)",
        (json.dumps(lam), json.dumps({"converged": [True, False]})),
    )
    con.commit()
    con.close()
    with Store(path) as st:
        assert list(st.raw()["converged"]) == [0]
        df = st.results()
    assert list(df.converged) == [True, False]


def _flagged(n_bad: int = 2):
    df = synthetic_results(n_checkpoints=8, lawa=False)
    df["converged"] = pd.array([pd.NA] * len(df), dtype="boolean")
    eig = df.probe == "eigen"
    df.loc[eig, "converged"] = True
    bad = df[eig].checkpoint.unique()[:n_bad]
    df.loc[eig & df.checkpoint.isin(bad), "converged"] = False
    return df, list(bad)


def test_correlations_leave_out_unconverged_values_and_count_them():
    df, bad = _flagged(2)
    s = series(df, "lambda_max")
    assert s[bad].isna().all() and s.notna().sum() == 6
    assert series(df, "lambda_max", include_unconverged=True).notna().sum() == 8
    assert sorted(unconverged(df, "lambda_max")) == sorted(bad)
    tab = summary(df, x="lambda_max", y="rtn:4:g128", methods=("pearson",), n_boot=50)
    assert (tab.n[0], tab.n_excluded[0], tab.n_unconverged[0]) == (6, 2, 2)
    kept = summary(df, x="lambda_max", y="rtn:4:g128", methods=("pearson",), n_boot=50, include_unconverged=True)
    assert (kept.n[0], kept.n_unconverged[0]) == (8, 0)
    # trace has no unconverged value: untouched
    assert summary(df, x="trace", y="rtn:4:g128", methods=("pearson",), n_boot=50).n[0] == 8


def test_correlate_command_says_how_many_were_left_out(swept):
    r = CliRunner().invoke(app, ["correlate", str(swept), "--x", "lambda_max", "--y", "rtn:4", "--n-boot", "50"])
    assert r.exit_code == 1, r.output  # nothing computable: every lambda_max is unconverged
    assert "4 value(s) left out because their estimator did not converge" in r.output
    assert "--include-unconverged" in r.output
    r = CliRunner().invoke(
        app,
        [
            "correlate",
            str(swept),
            "--x",
            "lambda_max",
            "--y",
            "rtn:4",
            "--n-boot",
            "50",
            "--include-unconverged",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output[r.output.index("[") :])
    assert rows[0]["n"] == N_CKPT and rows[0]["n_unconverged"] == 0


def test_figures_flag_unconverged_points():
    df, bad = _flagged(3)
    fig = curvature_figure(df, lr=False)
    flagged = [t for t in fig.data if "not converged" in (t.name or "")]
    assert len(flagged) == 1 and len(flagged[0].x) == 3 and flagged[0].marker.symbol == "circle-open"
    line = next(t for t in fig.data if t.name == "λ_max")
    assert len(line.x) == 5  # the line joins only converged values
    sc = sharpness_vs_quant_figure(df, x=("eigen", None, "lambda_1"), y="rtn:4:g128")
    marked = [t for t in sc.data if t.name == "not converged (left out of r)"]
    assert len(marked) == 1 and sorted(marked[0].customdata) == sorted(bad)
    assert sum(len(t.x) for t in sc.data) == 8


def test_report_lists_unconverged_values(tmp_path):
    df, bad = _flagged(2)
    tab = summary(df, x="lambda_max", y="rtn:4:g128", methods=("pearson",), n_boot=50)
    page = build_report(df, tmp_path / "r.html", correlations=tab).read_text()
    assert "Not converged (2)" in page and "n_unconverged" in page
    for ck in bad:
        assert ck in page.split('id="unconverged"', 1)[1].split("</section>", 1)[0]
    clean = synthetic_results(n_checkpoints=8, lawa=False)
    assert 'id="unconverged"' not in build_report(clean, tmp_path / "c.html").read_text()


def test_report_command_flags_a_real_sweep(swept, tmp_path):
    r = CliRunner().invoke(app, ["report", str(swept), "--out", str(tmp_path / "r.html"), "--n-boot", "50"])
    assert r.exit_code == 0, r.output
    page = (tmp_path / "r.html").read_text()
    assert f"Not converged ({2 * N_CKPT})" in page  # lambda_1 and lambda_2 of every checkpoint
