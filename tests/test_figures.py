"""losslens.study.report.figures and losslens.study.report.pages: traces and markers from results, the HTML report,
`losslens
report`."""

from __future__ import annotations

import math
import re
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from losslens.study import analysis, sweep
from losslens.measure.probes.rows import ProbeRow
from losslens.study.report.figures import (
    curvature_figure,
    loss_figure,
    quant_error_figure,
    synthetic_results,
    trajectory_figures,
)
from losslens.study.report.pages import build_report, export_png, surface_page
from losslens.study.report.scatter_figures import sharpness_vs_quant_figure
from losslens.study.report.surface_figures import surface_figure

PHASES = [
    {"name": "FP convergence", "step": 400, "lr": 1e-3},
    {"name": "quantization divergence", "step": 500, "lr": 7e-4},
]


@pytest.fixture(scope="module")
def df():
    return synthetic_results(n_checkpoints=6, runs=("wsd", "cosine"), specs=("rtn:4:g128", "int8"))


def _names(fig):
    return [t.name for t in fig.data]


def test_loss_figure_runs_derived_lr_and_phases(df):
    fig = loss_figure(df, phases=PHASES)
    names = _names(fig)
    assert names == [
        "FP loss · wsd",
        "FP loss · wsd (derived/LAWA)",
        "FP loss · cosine",
        "FP loss · cosine (derived/LAWA)",
        "LR · wsd",
        "LR · cosine",
    ]
    line, lawa = fig.data[0], fig.data[1]
    assert line.mode == "lines+markers" and lawa.mode == "markers" and lawa.marker.symbol == "star"
    assert len(line.x) == 6 and len(lawa.x) == 1
    wsd = df[(df.run == "wsd") & (df.probe == "loss") & (df.metric == "loss") & ~df.derived]
    assert list(line.y) == pytest.approx(wsd["value"].tolist())
    lr = fig.data[4]
    assert lr.yaxis == "y2" and fig.layout.yaxis2.title.text == "learning rate"
    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    vlines = [s for s in fig.layout.shapes if s.type == "line"]
    assert len(rects) == 2 and len(vlines) == 2 and rects[0].x0 == 400 and rects[1].x0 == 500 and rects[1].x1 == 600
    assert any("FP convergence" in a.text for a in fig.layout.annotations)


def test_quant_figure_is_small_multiples_per_spec_and_counts_non_positive(df):
    fig = quant_error_figure(df)
    series = [t for t in fig.data if not t.name.startswith("LR")]
    assert {t.meta for t in series} == {"rtn:4:g128", "int8"}
    axes = {spec: {t.yaxis for t in series if t.meta == spec} for spec in ("rtn:4:g128", "int8")}
    assert len(axes["rtn:4:g128"]) == len(axes["int8"]) == 1 and axes["rtn:4:g128"] != axes["int8"]  # one panel each
    for ax in (*axes["rtn:4:g128"], *axes["int8"]):
        assert fig.layout[ax.replace("y", "yaxis")].type == "log"
    assert [a.text for a in fig.layout.annotations[:2]] == ["rtn:4:g128", "int8"]
    # one legend entry per run (and its LR), not one per spec and run
    assert [t.name for t in fig.data if t.showlegend is not False] == [
        "wsd",
        "wsd (derived/LAWA)",
        "cosine",
        "cosine (derived/LAWA)",
        "LR · wsd",
        "LR · cosine",
    ]
    bad = df.copy()
    idx = bad.index[(bad.probe == "quant") & (bad.metric == "rel_loss_error")][:2]
    bad.loc[idx, "value"] = [-1e-4, 0.0]
    fig2 = quant_error_figure(bad)
    assert "2 value(s) ≤ 0 not shown" in fig2.layout.title.text
    drawn = sum(len(t.y) for t in fig2.data if not t.name.startswith("LR"))
    assert drawn == sum(len(t.y) for t in fig.data if not t.name.startswith("LR")) - 2


def test_curvature_figure_trace_and_lambda_with_error_bars(df):
    fig = curvature_figure(df, phases=PHASES)
    names = _names(fig)
    assert "trace (hutch++) · wsd" in names and "λ_max · cosine" in names and "λ_max · wsd (derived/LAWA)" in names
    tr = fig.data[names.index("trace (hutch++) · wsd")]
    assert tr.error_y.array is not None and len(tr.error_y.array) == 6
    assert sum(1 for t in fig.data if t.name and t.name.startswith("LR") and t.showlegend is not False) == 2
    assert len([s for s in fig.layout.shapes if s.type == "rect"]) == 4  # shaded in both rows


def test_scatter_coloured_by_step_with_correlation_in_title(df):
    corr = {"r": 0.91, "ci_low": 0.5, "ci_high": 0.98, "p": 0.002, "n": 6, "method": "pearson"}
    fig = sharpness_vs_quant_figure(df, y="rtn:4:g128", correlation=corr)
    assert "r = +0.910" in fig.layout.title.text and "95% CI +0.500, +0.980" in fig.layout.title.text
    first = fig.data[0]
    assert first.marker.colorbar.title.text == "step" and first.marker.showscale
    assert list(first.marker.color) == pytest.approx([100, 200, 300, 400, 500, 600])
    stars = [t for t in fig.data if t.marker.symbol == "star"]
    assert len(stars) == 2  # one LAWA point per run


def test_trajectory_figures_with_analysis_objects(df):
    wsd = df[df.run == "wsd"]
    phases = analysis.detect_phases(wsd, gap="rtn:4:g128")
    table = analysis.summary(wsd, n_boot=100)
    figs = trajectory_figures(df, phases=phases, correlations=table)
    assert list(figs) == ["loss", "quant", "sharpness", "scatter:rtn:4:g128", "scatter:int8"]
    row = table[(table.x == "trace") & (table.y == "rtn:4:g128") & (table.method == "pearson")].iloc[0]
    assert f"r = {row.r:+.3f}" in figs["scatter:rtn:4:g128"].layout.title.text
    c = analysis.correlate(np.arange(5.0), np.arange(5.0) ** 2, n_boot=50)
    fig = sharpness_vs_quant_figure(df, y="int8", correlation=c)
    assert f"r = {c.r:+.3f}" in fig.layout.title.text


def test_figures_never_crash_on_missing_probes():
    only_loss = synthetic_results(n_checkpoints=3)
    only_loss = only_loss[only_loss.probe == "loss"]
    figs = trajectory_figures(only_loss)
    assert list(figs) == ["loss"]
    fig = curvature_figure(only_loss)
    assert any("no 'trace'" in a.text for a in fig.layout.annotations)


def _tiny_surface():
    from losslens.geometry.surfaces.surface import Surface

    x, y = np.linspace(-1, 2, 5), np.linspace(-1, 2, 4)
    loss = 3 + np.add.outer(y**2, x**2)
    return Surface(
        x,
        y,
        loss,
        {"A": (0, 0, 3.0), "B": (1, 0, 4.0), "C": (0.1, 1, 4.1)},
        {"kind": "points", "norms": {"|B-A|": 1.0}},
    )


def test_build_report_is_one_self_contained_file(df, tmp_path):
    out = build_report(
        df,
        tmp_path / "sub" / "r.html",
        phases=PHASES,
        surfaces=[_tiny_surface()],
        plan={"quant": ["rtn:4:g128"]},
        versions={"torch": "x.y"},
        title="T",
    )
    text = out.read_text()
    assert text.count('<script type="text/javascript">/* plotly.js') == 1  # plotly.js embedded once
    assert not re.search(r"<script[^>]+src=", text)
    assert len(re.findall(r'class="plotly-graph-div"', text)) == 6  # 5 trajectory figures + 1 surface
    for section in ("Trajectory", "Phases", "Quantization planes", "Plan and versions"):
        assert f">{section}</h2>" in text
    assert "x.y" in text and "rtn:4:g128" in text
    with pytest.raises(ValueError, match="empty"):
        build_report(df.iloc[:0], tmp_path / "e.html")


def test_report_says_awq_can_lose_to_rtn_on_held_out_data(tmp_path):
    """Issue #12: where the report shows AWQ results it says that AWQ's guarantee is on its
    calibration objective only; without AWQ specs there is no such note."""
    from losslens.lm.quant.awq import HELD_OUT_NOTE

    with_awq = synthetic_results(n_checkpoints=4, specs=("rtn:4:g128", "awq:4:g128"))
    text = build_report(with_awq, tmp_path / "a.html").read_text()
    note = re.search(r'<p class="note" data-note="awq">(.*?)</p>', text)
    assert note and "awq:4:g128" in note.group(1) and "can be worse" in note.group(1)
    assert "held-out" in HELD_OUT_NOTE and "RTN" in HELD_OUT_NOTE
    text = build_report(synthetic_results(n_checkpoints=4), tmp_path / "b.html").read_text()
    assert 'data-note="awq"' not in text


def test_surface_page(tmp_path):
    out = surface_page(_tiny_surface(), tmp_path / "s.html", extra={"A (checkpoint)": "step-100"})
    text = out.read_text()
    assert len(re.findall(r'class="plotly-graph-div"', text)) == 3 and "step-100" in text


def _png_pixels(path) -> np.ndarray:
    """Decode an 8-bit, non-interlaced RGB/RGBA PNG into [height, width, channels] uint8 (stdlib +
    numpy; undoes the five PNG row filters)."""
    import struct
    import zlib

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    c = 3 if colour == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(h, 1 + w * c)
    out = np.zeros((h, w * c), dtype=np.int32)
    for y in range(h):
        f, row = raw[y, 0], raw[y, 1:].astype(np.int32)
        up = out[y - 1] if y else np.zeros(w * c, dtype=np.int32)
        if f in (0, 2):
            out[y] = (row + (up if f == 2 else 0)) % 256
        else:
            cur = out[y]
            for i in range(w * c):
                a = cur[i - c] if i >= c else 0
                b, d = up[i], (up[i - c] if i >= c else 0)
                if f == 1:
                    pred = a
                elif f == 3:
                    pred = (a + b) // 2
                else:
                    p = a + b - d
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - d)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else d)
                cur[i] = (row[i] + pred) % 256
    return out.reshape(h, w, c).astype(np.uint8)


def test_png_export_writes_the_figure(tmp_path):
    """`losslens surface --png` / export_png through kaleido (dev extras) and the system Chromium.
    Without kaleido: a warning and False (outside CI only; under CI the dev extras must have it)."""
    import importlib.util

    from tests.environment import CHROMIUM, UNDER_CI

    fig = surface_figure(_tiny_surface())
    if importlib.util.find_spec("kaleido") is None:
        if UNDER_CI:
            pytest.fail("CI=true but kaleido is not installed: it is in the dev extras (pip install -e '.[dev]')")
        with pytest.warns(RuntimeWarning, match="kaleido"):
            assert export_png(fig, tmp_path / "s.png") is False
        pytest.skip("kaleido is not installed here: the real export is tested where it is (make test, CI)")
    if CHROMIUM is None and not UNDER_CI:
        pytest.skip("no system Chromium for kaleido (run scripts/install-browser.sh)")
    out = tmp_path / "s.png"
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a failed export warns: make it fail the test
        assert export_png(fig, out, width=640, height=360) is True
    px = _png_pixels(out)
    assert px.shape[:2] == (360, 640)
    rgb = px[..., :3].reshape(-1, 3).astype(int)
    # the loss is drawn in Viridis: a blank figure (axes and grid only) has 0.04% of its pixels
    # within 40 levels of a Viridis anchor colour, this one 28%
    viridis = np.array([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]])
    near = np.abs(rgb[:, None, :] - viridis[None]).max(axis=-1).min(axis=-1) < 40
    assert near.mean() > 0.1, near.mean()


def test_report_command_on_a_store(df, tmp_path):
    from typer.testing import CliRunner

    from losslens.cli.app import app

    path = tmp_path / "results.sqlite"
    wsd = df[df.run == "wsd"]
    with sweep.Store(path) as st:
        cks = wsd.drop_duplicates("checkpoint")
        st.add_checkpoints(
            (
                SimpleNamespace(
                    label=r.checkpoint,
                    step=int(r.step),
                    tokens=int(r.tokens),
                    lr=None if r.lr is None or (isinstance(r.lr, float) and math.isnan(r.lr)) else r.lr,
                    kind="derived" if r.derived else "hf_dir",
                    location=None,
                )
                for r in cks.itertuples()
            ),
            run="wsd",
        )
        for (ck, probe, spec), g in wsd.groupby(["checkpoint", "probe", "spec"], sort=False):
            metrics = [
                {
                    "metric": m.metric,
                    "value": m.value,
                    "stderr": None if math.isnan(m.stderr) else m.stderr,
                    "ci_low": None,
                    "ci_high": None,
                }
                for m in g.itertuples()
            ]
            st.write(ProbeRow(ck, probe, spec, metrics=metrics), data_hash="h", run="wsd")
        st.write(ProbeRow("wsd-step100", "kurtosis", "", status="failed", error="ValueError: boom"), run="wsd")
    surf = tmp_path / "plane.json"
    _tiny_surface().save(surf)
    out = tmp_path / "report.html"
    res = CliRunner().invoke(app, ["report", str(path), "--out", str(out), "--surface", str(surf), "--n-boot", "100"])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "Correlations" in text and "Phases" in text and "boom" in text and "plane" in text
    assert len(re.findall(r'class="plotly-graph-div"', text)) == 6
    res = CliRunner().invoke(app, ["report", str(tmp_path / "missing.sqlite")])
    assert res.exit_code == 2


# --------------------------------------------------------------------------- issue 49: a report that reads at a glance
def _run_of(trace, runs):
    """The run a trace draws (None for the LR lines and the flagged-point overlays)."""
    name = str(trace.name or "")
    if name.startswith("LR") or "not converged" in name or "product error" in name:
        return None
    for r in runs:
        if trace.legendgroup == r or name == r or f"· {r}" in name or name.startswith(f"{r} ("):
            return r
    return None


def _trace_colour(trace):
    if trace.type != "scatter":  # heatmaps and bars carry no run colour
        return None
    for c in (trace.line.color, trace.marker.color, trace.marker.line.color):
        if isinstance(c, str):
            return c
    return None


def test_a_run_has_one_colour_in_every_figure_of_a_page(df):
    """The loss, quant, sharpness and scatter figures drew a run in a colour that depended on the
    series' index (red was one run in the trace panel, another in λ_max). Under page_colours each
    run has one colour everywhere, from the sorted run names; without a page map, from the figure's."""
    from losslens.study.report.explain_figures import explain_figures, synthetic_explain
    from losslens.study.report.figure_parts import page_colours, run_colour_map

    full = synthetic_explain(df)
    with page_colours(["wsd", "cosine", "extra"]) as colours:
        figs = {**trajectory_figures(full), **explain_figures(full)}
        alone = trajectory_figures(full[full["run"] == "wsd"])  # a figure of one run keeps the page's colour
    assert colours == run_colour_map(["cosine", "extra", "wsd"]) and colours["cosine"] != colours["wsd"]
    seen: dict[str, set] = {}
    for fig in [*figs.values(), *alone.values()]:
        for t in fig.data:
            run = _run_of(t, ("wsd", "cosine"))
            if run is not None and _trace_colour(t) is not None:
                seen.setdefault(run, set()).add(_trace_colour(t))
    assert seen == {"wsd": {colours["wsd"]}, "cosine": {colours["cosine"]}}, seen
    # outside a page the colours come from the figure's own sorted runs
    fig = loss_figure(df)
    assert {_trace_colour(t) for t in fig.data if _run_of(t, ("cosine",))} == {
        run_colour_map(["wsd", "cosine"])["cosine"]
    }


def test_quantization_error_is_drawn_in_percent_as_the_printed_summary(df):
    """ΔQ L = L(θ̂)/L(θ) − 1 in % on every axis and hover (the figures drew the fraction, ticks `100µ`)."""
    fig = quant_error_figure(df, specs=["rtn:4:g128"])
    assert fig.layout.yaxis.title.text == "ΔQ L (%)" and "ΔQ L (%)" in fig.layout.title.text
    rows = df[(df.probe == "quant") & (df.spec == "rtn:4:g128") & (df.metric == "rel_loss_error") & (df.run == "wsd")]
    real = rows[~rows["derived"]].sort_values("step")["value"].to_numpy()
    line = next(t for t in fig.data if t.name == "wsd" and t.mode == "lines+markers")
    assert list(line.y) == pytest.approx(list(100 * real)) and "%" in line.hovertemplate
    scatter = sharpness_vs_quant_figure(df, y="rtn:4:g128")
    assert scatter.layout.yaxis.title.text == "ΔQ L (%) (rtn:4:g128)"
    assert max(max(t.y) for t in scatter.data) == pytest.approx(100 * rows["value"].max())


def test_tables_name_columns_for_people_and_keep_the_raw_name_in_a_tooltip():
    from losslens.study.report.labels import COLUMN_LABELS
    from losslens.study.report.page_sections import _table

    html = _table([{"trace_per_param": 0.5, "kappa_ci": "[-0.1, +0.2]", "note": "a long note " * 20}])
    assert '<th class="" title="trace_per_param">Δ log tr H / n</th>' in html
    assert f'title="kappa_ci">{COLUMN_LABELS["kappa_ci"]}</th>' in html
    assert html.startswith('<div class="table-wrap">') and '<td class="l wrap">a long note' in html


def test_monitor_section_says_which_evaluations_were_skipped_and_why():
    import pandas as pd

    from losslens.study.report.page_notes import monitor_note

    live = pd.DataFrame({"step": [100, 600, 700, 800]})
    meta = {
        "settings": {"every": 100, "time_budget": 0.1},
        "skipped_for_time": 4,
        "skipped_steps": [200, 300, 400, 500],
    }
    note = monitor_note(live, meta)
    assert "Measured at step(s) 100, 600, 700, 800." in note and "Planned every 100 steps." in note
    assert "Skipped step(s) 200, 300, 400, 500: the monitor keeps its measurements within 10% of the training" in note
    older = monitor_note(live, {"settings": {"every": 100, "time_budget": 0.1}, "skipped_for_time": 4})
    assert "4 planned evaluation(s) skipped" in older and "does not record which steps" in older
    assert "No planned evaluation was skipped" in monitor_note(live, {"settings": {"every": 100}})
