"""Issue #35: a result row whose Hessian products' measured error is over the tolerance is marked in
the report: an open orange diamond on its point of the trajectory and scatter figures (hover: the
error, cause and fix) and a section listing it; a store with no such row shows neither."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from losslens.study.report.figures import trajectory_figures
from losslens.study.report.flags import PRODUCT_ERROR_MARKER, product_error_table
from losslens.study.report.pages import build_report, load_store
from losslens.study.sweep import Store
from losslens.measure.probes.rows import ProbeRow, hvp_error_flag, metric

STEPS = (100, 200, 300, 400)
FLAGGED = "step-000300"


def _inexact_operator(rel_error: float):
    """What :func:`hvp_error_flag` reads of an operator: its measured check and compute dtype."""
    check = {"backend": "difference", "rel_error": rel_error, "reference": "reverse-over-reverse (float32) on 2x16"}
    return SimpleNamespace(checked=lambda: check, param_dtype=torch.bfloat16)


def _store(path, flag: bool):
    with Store(path) as st:
        st.add_checkpoints(
            [
                SimpleNamespace(label=f"step-{s:06d}", step=s, tokens=64 * s, lr=1e-3, kind="hf_dir", location=None)
                for s in STEPS
            ],
            run="wsd",
        )
        for i, s in enumerate(STEPS):
            ck = f"step-{s:06d}"
            extra = hvp_error_flag(_inexact_operator(0.19 if flag and ck == FLAGGED else 2e-4))
            st.write(ProbeRow(ck, "loss", "", metrics=[metric("loss", 4.0 - 0.1 * i)]), data_hash="h", run="wsd")
            trace = 100.0 + 10 * i
            st.write(
                ProbeRow(
                    ck, "trace", "hutch++", metrics=[metric("trace", trace, 1.0, trace - 2, trace + 2)], extra=extra
                ),
                data_hash="h",
                run="wsd",
            )
            st.write(
                ProbeRow(ck, "quant", "rtn:4:g128", metrics=[metric("rel_loss_error", 1e-3 * (1 + i))]),
                data_hash="h",
                run="wsd",
            )
    return path


@pytest.fixture(scope="module")
def flagged(tmp_path_factory):
    return _store(tmp_path_factory.mktemp("flagged") / "results.sqlite", flag=True)


def _marks(fig) -> list:
    return [t for t in fig.data if t.marker is not None and t.marker.symbol == PRODUCT_ERROR_MARKER["symbol"]]


def test_the_flagged_row_is_in_the_table_and_marked_in_the_figures(flagged):
    df, _, _ = load_store(flagged)
    flags = df[df["error_warning"] != ""]
    assert list(zip(flags.checkpoint, flags.probe)) == [(FLAGGED, "trace")]  # only the row whose error is over 1e-2
    warning = json.loads(flags["error_warning"].iloc[0])
    assert warning["rel_error"] == 0.19 and warning["cause"] == "half-precision compute (bfloat16)"
    (row,) = product_error_table(df)
    assert (row["checkpoint"], row["step"], row["probe"], row["spec"], row["rel_error"]) == (
        FLAGGED,
        300,
        "trace",
        "hutch++",
        0.19,
    )
    figs = trajectory_figures(df)
    (mark,) = _marks(figs["sharpness"])  # on the trace line, at the flagged step and value
    assert list(mark.x) == [300.0] and list(mark.y) == [120.0]
    assert "0.19 > 0.01" in mark.text[0] and "--compute-dtype float32" in mark.text[0]
    (dot,) = _marks(figs["scatter:rtn:4:g128"])  # the scatter point of that checkpoint
    assert list(dot.x) == [120.0] and list(dot.customdata) == [FLAGGED] and "bfloat16" in dot.text[0]


def test_the_report_has_a_section_for_it(flagged, tmp_path):
    from typer.testing import CliRunner

    from losslens.cli.app import app

    out = tmp_path / "report.html"
    res = CliRunner().invoke(app, ["report", str(flagged), "--out", str(out), "--n-boot", "50"])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    section = text[text.index('<section id="product-error">') :]
    section = section[: section.index("</section>")]
    assert "Product error over the tolerance (1)" in section and FLAGGED in section
    assert "half-precision compute (bfloat16)" in section and "--compute-dtype float32" in section
    assert '<a href="#product-error">' in text


def test_an_unflagged_store_shows_no_mark(tmp_path):
    df, _, _ = load_store(_store(tmp_path / "clean.sqlite", flag=False))
    assert (df["error_warning"] == "").all() and product_error_table(df) == []
    assert not any(_marks(f) for f in trajectory_figures(df).values())
    text = build_report(df, tmp_path / "clean.html", versions={}).read_text()
    assert "product-error" not in text and "Product error over the tolerance" not in text
