"""`losslens demo --quick` end to end: report written, store complete, summary printed, resumable."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from losslens.cli.app import app
from losslens.study.demo.demo_settings import QUICK, DemoError, DemoOptions
from losslens.study.demo.demo_study import run_demo
from losslens.study.sweep import Store


def test_demo_refuses_an_unknown_executor_before_any_work(tmp_path):
    """Issue #46 item 3: the library checks the demo's options (the command only parses and prints)."""
    with pytest.raises(DemoError, match="unknown executor 'dask'; valid: local, ray"):
        run_demo(DemoOptions(out=tmp_path / "demo", executor="dask"))
    assert not (tmp_path / "demo").exists()


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    # on 2 worker processes (training, sweeps, planes); the rerun below resumes in one process
    result = CliRunner().invoke(app, ["demo", "--quick", "--out", str(out), "--quiet", "--workers", "2"])
    assert result.exit_code == 0, result.output
    return out, result.output


def test_demo_writes_report_store_and_summary(demo_dir):
    out, output = demo_dir
    html = (out / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "plotly" in html.lower()
    # one quantization plane per run, drawn from the stored surfaces
    for run in QUICK.runs:
        assert run.name in output and (out / "surfaces" / f"{run.name}.json").is_file()
        assert run.name in html
    assert "Final checkpoint of each run" in output and "r(trace, ΔQ" in output
    assert f"report: {out / 'report.html'}" in output
    assert "training wsd-lr0.003" in output and "on 2 workers" in output
    assert "r(lambda_max, ΔQ rtn:2:g32) = +nan" not in output  # λ_max converged (Lanczos) on every checkpoint

    with Store(out / "results.sqlite") as st:
        raw = st.raw()
        assert st.runs() == [r.name for r in QUICK.runs]
    assert (raw["status"] == "ok").all(), raw.loc[raw["status"] != "ok", "error"].tolist()
    n_tasks = len(QUICK.plan(QUICK.runs[0]).tasks())
    n_checkpoints = QUICK.checkpoints + 1  # + one LAWA checkpoint per run
    assert len(raw) == len(QUICK.runs) * n_checkpoints * n_tasks
    assert not raw.duplicated(["run", "checkpoint", "probe", "spec"]).any()
    # the explain probe ran for every quantizer on every checkpoint; its analysis is printed and written
    ex = raw[raw["probe"] == "explain"]
    assert set(ex["spec"]) == set(QUICK.explain) and len(ex) == len(QUICK.runs) * n_checkpoints * len(QUICK.explain)
    assert "Why ΔQ changes" in output and (out / "explain.md").read_text().startswith("**Change of log ΔQ")
    assert 'data-figure="explain:factors"' in html and ">Why quantization error changes</h2>" in html


def test_demo_draws_its_runs_in_one_landscape(demo_dir):
    """Every run's real checkpoints in one principal plane, the headline spec's points on it; the own
    loss of each checkpoint equals the sweep's FP loss row (another code path: the loss probe)."""
    import json

    out, output = demo_dir
    land = json.loads((out / "landscape" / "landscape.json").read_text())
    n = len(QUICK.runs) * QUICK.checkpoints
    assert len(land["pca"]["checkpoints"]) == n and len(land["quantized"]) == n
    assert land["spec"] == QUICK.headline_spec and land["surface"]["shape"] == [QUICK.landscape_grid] * 2
    assert [r["name"] for r in land["runs"]] == [r.name for r in QUICK.runs]
    with Store(out / "results.sqlite") as st:
        df = st.results()
    fp = df[(df["probe"] == "loss") & (df["metric"] == "loss")]
    for row in land["pca"]["checkpoints"]:
        run, label = row["label"].split("/")
        want = fp[(fp["run"] == run) & (fp["checkpoint"] == label)]["value"]
        assert len(want) == 1 and row["own_loss"] == pytest.approx(float(want.iloc[0]), rel=1e-6)
    html = (out / "report.html").read_text()
    assert ">Landscape of the runs</h2>" in html and 'data-figure="landscape"' in html
    assert "explained variance %" in html and "landscape of 2 runs in one principal plane" in output
    assert json.loads((out / "summary.json").read_text())["seconds"]["landscape"] > 0


def test_demo_prints_no_nan_and_each_warning_once(demo_dir):
    """Issue #49: the demo's output (stdout and stderr) has no `nan` (a descriptive row says why) and says
    each warning, alarm or thing not computed once; no warning in Python's `file.py:N: XWarning` form."""
    _, output = demo_dir
    lines = output.splitlines()
    assert not [ln for ln in lines if re.search(r"\bnan\b", ln, re.IGNORECASE)]
    said = [
        re.sub(r"^\s*(\[[\w-]+\]\s*)?", "", ln).strip()
        for ln in lines
        if re.search(r"warning|alarm|not computed", ln, re.IGNORECASE)
    ]
    assert len(said) == len(set(said)), [ln for ln in said if said.count(ln) > 1]
    assert not re.search(r"\.py:\d+: \w*Warning", output)


@pytest.mark.browser
def test_demo_report_with_its_landscape_renders_in_chromium(demo_dir):
    from tests.test_report_browser import ARTIFACTS, _check_page, chromium_driver

    out, _ = demo_dir
    with chromium_driver() as driver:
        assert _check_page(driver, out / "report.html", ARTIFACTS / "demo-report.png") >= 5
        drawn = driver.execute_script(
            "const d = document.querySelector('#landscape .plotly-graph-div');"
            "return d ? d._fullData.map(t => t.name) : null"
        )
    assert drawn is not None, "the report has no landscape figure"
    assert set(r.name for r in QUICK.runs) <= set(drawn) and f"quantized ({QUICK.headline_spec})" in drawn


def test_demo_rerun_resumes_without_recomputing(demo_dir):
    out, _ = demo_dir
    with Store(out / "results.sqlite") as st:
        before = st.raw()[["run", "checkpoint", "probe", "spec", "created"]]
    result = CliRunner().invoke(app, ["demo", "--quick", "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "training" in result.output and not re.search(r"quantization plane of", result.output)
    with Store(out / "results.sqlite") as st:
        after = st.raw()[["run", "checkpoint", "probe", "spec", "created"]]
    assert after.equals(before)  # nothing rewritten


def test_demo_scores_the_embedded_task_along_its_trajectories(demo_dir):
    pytest.importorskip("lm_eval")
    out, output = demo_dir
    with Store(out / "results.sqlite") as st:
        df = st.results()
    acc = df[df["probe"] == "accuracy"]
    assert set(acc["spec"].str.split("@").str[0]) == {"fp", QUICK.headline_spec}
    d = acc[(acc["spec"] == QUICK.headline_spec) & (acc["metric"] == "delta_acc")]
    assert len(d) == len(QUICK.runs) * (QUICK.checkpoints + 1) and d["ci_low"].notna().all()
    html = (out / "report.html").read_text()
    assert ">Loss vs task accuracy</h2>" in html and 'data-figure="loss_vs_accuracy"' in html
    assert "Does task accuracy fall where ΔQ rises" in output and "Does task accuracy fall" in html


def test_demo_report_shows_the_monitored_run_live(demo_dir):
    """The first run is trained under losslens.study.monitor: its store holds rows taken while it trained
    (at multiples of monitor_every, the first always), and the report draws them."""
    out, _ = demo_dir
    html = (out / "report.html").read_text()
    with Store(out / "monitor.sqlite") as st:
        df = st.results()
    assert set(df["run"]) == {QUICK.monitor_run} and (df["status"] == "ok").all()
    steps = sorted(int(s) for s in df["step"].dropna().unique())
    assert steps and steps[0] == QUICK.monitor_every and all(s % QUICK.monitor_every == 0 for s in steps)
    assert {"loss", "quant", "trace", "eigen"} <= set(df["probe"])
    assert f'data-figure="live:{QUICK.monitor_run}' in html and "Live monitor" in html


def test_demo_exits_1_and_flags_failed_probes(demo_dir):
    """A probe row stored as failed (here: marked so in the store, as a crash would leave it) makes
    the demo exit 1, with the failure in the summary, on stderr and in the report; it used to exit 0."""
    import sqlite3

    out, _ = demo_dir
    run = QUICK.runs[0].name
    with sqlite3.connect(out / "results.sqlite") as con:
        n = con.execute(
            "UPDATE results SET status = 'failed', error = 'RuntimeError: planted failure' "
            "WHERE id = (SELECT MIN(id) FROM results WHERE run = ? AND probe = 'kurtosis')",
            (run,),
        ).rowcount
    assert n == 1
    result = CliRunner().invoke(app, ["demo", "--quick", "--out", str(out), "--quiet"])
    assert result.exit_code == 1, result.output
    assert f"FAILED (exit status 1):\n  1 probe row(s) failed in {run}" in result.output
    assert f"error: 1 probe row(s) failed in {run}" in result.output
    html = (out / "report.html").read_text()
    assert 'data-note="failed"' in html and f"1 probe row(s) failed in {run}" in html
    # the correlation table shows the dependence-aware statistics: an interval with n_eff, or why not
    assert "runs the independent units" in result.output
    assert "n_eff=" in result.output or "; descriptive: " in result.output
    summary = result.output.split("Sharpness vs quantization error", 1)[1].split("report:", 1)[0]
    assert not re.search(r"(?<![\w.])[+-]?nan\b", summary), summary
    for raw in ("n_eff", "inference", "r_within"):  # human headers, the raw name in the tooltip
        assert f'title="{raw}">' in html, raw
