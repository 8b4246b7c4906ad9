"""The explain probe in sweeps (plan, runner, store), its analysis (shares that sum to the change of
log ΔQ) and its report section."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from losslens.study.analysis import AnalysisError, series
from losslens.study.analysis.explain_shares import (
    TERMS,
    decay_window,
    decompose_change,
    factor_table,
    format_check,
    science_check,
)
from losslens.study.report.explain_figures import explain_heatmap_figure, synthetic_explain
from losslens.study.report.figures import synthetic_results
from losslens.study.sweep import ExplainProbe, Plan, PlanError, Store, run_sweep
from losslens.study.sweep.testing import tiny_token_sets, tiny_trajectory

DATA = {"eval": [2, 2, 16], "calibration": [2, 2, 16], "curvature": [1, 2, 16]}


def test_plan_explain_settings_tasks_and_hash():
    p = Plan.from_dict({"probes": {"explain": {"specs": ["rtn:4", "gptq:3"], "within": True}}})
    assert p.explain == ExplainProbe(("rtn:4:g128", "gptq:3:g128"), ("layer", "kind"), True, 30, "hutch++")
    assert Plan.from_dict(p.to_dict()) == p and Plan.from_dict(p.to_dict()).hash == p.hash
    assert [t.key for t in p.tasks()] == [("explain", "rtn:4:g128"), ("explain", "gptq:3:g128")]
    assert all(t.curvature for t in p.tasks()) and p.needs_curvature
    # a list of specs is enough; adding a spec leaves the other spec's row settings alone
    q = Plan(loss=False, explain=["rtn:4"])
    more = Plan(loss=False, explain=["rtn:4", "int8"])
    assert q.tasks()[0].config_hash == more.tasks()[0].config_hash
    assert (
        Plan(loss=False, explain=ExplainProbe(["rtn:4"], within=True)).tasks()[0].config_hash
        != q.tasks()[0].config_hash
    )
    # a plan without explain is unchanged (its hash does not see the new field)
    assert "explain" not in Plan.default().to_dict()["probes"]
    for bad, msg in (
        ({"specs": []}, "non-empty"),
        ({"specs": ["rtn:4"], "blocks": ["rows"]}, "unknown"),
        ({"specs": ["rtn:4"], "trace_method": "exact"}, "trace_method"),
        ({"specs": ["rtn:99"]}, "invalid"),
        ({"specs": ["rtn:4"], "colour": 1}, "unknown option"),
    ):
        with pytest.raises(PlanError, match=msg):
            Plan.from_dict({"probes": {"explain": bad}})


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    root = tmp_path_factory.mktemp("explain")
    traj = tiny_trajectory(root / "t", n=3, seed=3)
    quantized = "model.layers.*_proj.weight"  # the quantized matrices of the tiny Llama: the trace probe's space = δ's
    plan = Plan.from_dict(
        {
            "name": "ex",
            "data": DATA,
            "lawa": [2],
            "curvature_params": [quantized],
            "probes": {
                "directional": ["rtn:3:row"],
                "trace": {"method": "hutch++", "num_matvecs": 6},
                "explain": {"specs": ["rtn:3:row", "gptq:3:row", "int8"], "within": True, "trace_matvecs": 6},
            },
        }
    )
    out = root / "r.sqlite"
    rep = run_sweep(traj, plan, out=out, token_sets=tiny_token_sets(traj), progress=False, num_threads=1)
    assert rep.n_failed == 0, rep.failures
    with Store(out) as st:
        return traj, plan, st.results(), st.raw()


def test_sweep_rows_share_the_direction_and_the_trace(swept):
    traj, plan, df, raw = swept
    c = df[df.checkpoint == "step-000300"]
    ex = c[(c.probe == "explain") & (c.spec == "rtn:3:row")].set_index("metric")
    d = c[c.probe == "directional"].set_index("metric")["value"]
    assert ex.loc["gTd", "value"] == d["gTd"] and 2 * ex.loc["quadratic", "value"] == pytest.approx(d["dHd"], rel=1e-15)
    assert ex.loc["actual_delta", "value"] == d["actual_delta"]
    tr = c[c.probe == "trace"].iloc[0]
    assert ex.loc["trace", "value"] == tr["value"] and ex.loc["trace", "stderr"] == tr["stderr"]  # reused, same space
    rows = raw[(raw.checkpoint == "step-000300") & (raw.probe == "explain")].set_index("spec")
    assert (
        rows.loc["rtn:3:row", "n_hvp"] == 4
    )  # within parts only: HVP shared with directional, trace with the trace probe
    assert rows.loc["gptq:3:row", "n_hvp"] == 1 + 4
    f = ex["value"]
    assert f["pred_delta"] == pytest.approx(f["gTd"] + f["quadratic"], rel=1e-12)
    assert f["remainder"] == pytest.approx(f["actual_delta"] - f["pred_delta"], rel=1e-9, abs=1e-15)
    assert 0.5 * f["norm2"] * f["trace_per_param"] * f["kappa"] == pytest.approx(f["quadratic"], rel=1e-12)
    assert ex.loc["kappa", "ci_low"] <= f["kappa"] <= ex.loc["kappa", "ci_high"] or f["trace"] < 0
    for part in ("layer", "kind"):
        for q, total in (("dHd", 2 * f["quadratic"]), ("gTd", f["gTd"]), ("norm2", f["norm2"])):
            parts = f[[m for m in f.index if m.startswith(f"{q}[{part}:")]]
            assert len(parts) == 2 and math.fsum(parts) == pytest.approx(total, rel=1e-12, abs=1e-15)
    assert {m for m in f.index if m.startswith("within[layer:")} == {"within[layer:layer0]", "within[layer:layer1]"}
    # LAWA rows too; the default series of the probe is κ
    assert set(df[df.probe == "explain"].checkpoint) == {
        "step-000100",
        "step-000200",
        "step-000300",
        "lawa2@step-000300",
    }
    s = series(df, "explain/gptq:3:row")
    assert s.name == "explain/gptq:3:row" and len(s) == 3 and s.notna().all()


def test_trace_reuse_does_not_change_numbers_on_resume(swept, tmp_path):
    traj, plan, df, _ = swept
    alone = plan.replace(directional=(), trace=None)  # explain computes every measurement and its own trace
    out = tmp_path / "alone.sqlite"
    rep = run_sweep(traj, alone, out=out, token_sets=tiny_token_sets(traj), progress=False, num_threads=1)
    assert rep.n_failed == 0, rep.failures
    with Store(out) as st:
        again = st.results()
    key = ["checkpoint", "spec", "metric"]
    a = df[df.probe == "explain"].set_index(key)["value"].sort_index()
    b = again[again.probe == "explain"].set_index(key)["value"].sort_index()
    pd.testing.assert_series_equal(a, b, check_exact=False, rtol=1e-12)


def test_analysis_on_a_real_sweep(swept):
    _, _, df, _ = swept
    tab = factor_table(df, "gptq:3:row")
    assert list(tab.checkpoint) == ["step-000100", "step-000200", "step-000300", "lawa2@step-000300"]
    assert tab.derived.tolist() == [False, False, False, True] and {"kappa_ci_low", "trace_stderr"} <= set(tab.columns)
    check = science_check(df)  # random-weight model: some decompositions are refused, never silently wrong
    assert set(check) == {"decay", "quantizers", "lawa", "notes"}
    q = check["quantizers"].set_index("calibrated").loc["gptq:3:row"]
    assert q["rtn"] == "rtn:3:row" and q["n"] == 3


@pytest.fixture(scope="module")
def synth():
    return synthetic_explain(synthetic_results(n_checkpoints=8, runs=("wsd", "cosine"), specs=("rtn:4:g128", "int8")))


def test_decomposition_shares_sum_to_the_change_of_log_dq(synth):
    tab = factor_table(synth, "rtn:4:g128")
    a, b = decay_window(tab, "wsd")
    assert (a, b) == ("wsd-step500", "wsd-step800")
    dec = decompose_change(tab, a, b, run="wsd").set_index("term")
    assert list(dec.index) == [*TERMS, "total"]
    ra, rb = (tab[tab.checkpoint == x].iloc[0] for x in (a, b))
    want = math.log(rb["rel_delta"] / ra["rel_delta"])
    assert dec.loc["total", "log_change"] == pytest.approx(want, rel=1e-12)
    assert math.fsum(dec.loc[list(TERMS), "log_change"]) == pytest.approx(want, rel=1e-12)
    assert dec.loc["norm2", "log_change"] == pytest.approx(math.log(rb["norm2"] / ra["norm2"]), rel=1e-12)
    assert dec.loc["kappa", "ci_low"] < dec.loc["kappa", "log_change"] < dec.loc["kappa", "ci_high"]
    assert dec.loc["norm2", "stderr"] == 0 and dec.loc["trace_per_param", "stderr"] > 0
    se = math.hypot(ra["trace_stderr"] / ra["trace"], rb["trace_stderr"] / rb["trace"])
    assert dec.loc["kappa", "stderr"] == pytest.approx(se)
    absolute = decompose_change(tab, a, b, run="wsd", target="abs").set_index("term")
    assert "fp_loss" not in absolute.index
    assert absolute.loc["total", "log_change"] == pytest.approx(math.log(rb["actual_delta"] / ra["actual_delta"]))
    bad = tab.copy()
    bad.loc[bad.checkpoint == b, "actual_delta"] = -1e-4
    with pytest.raises(AnalysisError, match="need both > 0"):
        decompose_change(bad, a, b, run="wsd")
    with pytest.raises(AnalysisError, match="several runs"):
        decompose_change(
            factor_table(synth.assign(checkpoint=synth.checkpoint.str.replace("cosine", "wsd"))),
            "wsd-step100",
            "wsd-step200",
        )


def test_science_check_and_report_section(synth, tmp_path):
    check = science_check(synth, specs=["rtn:4:g128", "gptq:4:g128"])
    assert set(check["decay"].run) == {"wsd", "cosine"} and (check["decay"].driver == "trace_per_param").all()
    q = check["quantizers"].iloc[0]
    assert (q["calibrated"], q["rtn"], q["n"]) == ("gptq:4:g128", "rtn:4:g128", 16)
    assert q["log_quadratic_ratio"] == pytest.approx(q["log_norm2_ratio"] + q["log_kappa_ratio"], rel=1e-9)
    assert q["log_kappa_ratio"] < 0  # GPTQ lowers κ here; but 2 runs × 8 autocorrelated checkpoints support no
    # interval (issue 37: runs are the independent units; this used to assert a t-interval over the 16 checkpoints)
    assert q["log_kappa_ratio_inference"] == "descriptive" and all(math.isnan(v) for v in q["log_kappa_ratio_ci"])
    assert len(check["lawa"]) == 4
    text = format_check(check)
    assert "| gptq:4:g128 vs rtn:4:g128 | 16 |" in text and "over the LR decay" in text
    fig = explain_heatmap_figure(synth, "rtn:4:g128")
    wsd = synth[(synth.run == "wsd") & ~synth.derived & (synth.probe == "explain") & (synth.spec == "rtn:4:g128")]
    want = 0.5 * wsd[wsd.metric == "dHd[layer:layer1]"]["value"].to_numpy()
    assert fig.data[0].y == ("layer0", "layer1") and list(fig.data[0].z[1]) == pytest.approx(want)
    from losslens.study.report.pages import build_report

    html = build_report(synth, tmp_path / "r.html").read_text()
    assert ">Why quantization error changes</h2>" in html
    for name in ("explain:factors", "explain:blocks", "explain:shares"):
        assert f'data-figure="{name}"' in html
    assert "Calibrated quantizers vs RTN at equal bits" in html
