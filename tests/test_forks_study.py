"""benchmarks/forks_study.py (issue #47, item 3) on a tiny GGUF written here: the recipe's commands
(fork → sweep per fork into one store → correlate → landscape → report) run end to end, each fork is
its own run in the store, and the forks' shared base reads the same numbers in every fork. The real
run (SmolLM2-135M) is a benchmark: CI never downloads the model."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("gguf")


def test_the_study_on_a_tiny_gguf(tmp_path, monkeypatch):
    from benchmarks.forks_study import QUANT, forks_of, run, table
    from losslens.study.sweep import Store
    from tests.gguf_files import train_tiny_llama, write_gguf
    from tests.test_report_browser import browser_missing

    monkeypatch.setenv("LOSSLENS_CACHE_DIR", str(tmp_path / "cache"))
    model, tok = train_tiny_llama(steps=2)
    base = write_gguf(tmp_path / "tiny.gguf", model, tok, linear_type="F32")
    out = tmp_path / "study"
    summary = run(
        str(base),
        out,
        steps=2,
        checkpoints=1,
        schedules=("constant", "cosine"),
        threads=1,
        trace_matvecs=3,
        lanczos=3,
        accuracy_limit=8,
        grid=3,
        browser=browser_missing() is None,
    )
    forks = [f.name for f in forks_of(out)]
    assert forks == ["constant-n2-s0", "cosine-n2-s0"]
    assert all(stage.get("returncode", 0) == 0 for stage in summary["stages"].values())
    assert summary == json.loads((out / "study.json").read_text())
    with Store(out / "results.sqlite") as st:
        df = st.results()
    assert sorted(df["run"].unique()) == forks and (df["status"] == "ok").all()
    assert {q for q in df.loc[df["probe"] == "quant", "spec"]} == {str(_parse(q)) for q in QUANT}
    # the base is each fork's first checkpoint: the same weights, the same numbers in both runs
    base_rows = df[df["step"] == 0].set_index(["run", "probe", "spec", "metric"])["value"]
    constant, cosine = base_rows.loc[forks[0]], base_rows.loc[forks[1]]
    assert len(constant) > 20 and constant.sort_index().equals(cosine.sort_index())
    # after the base the forks differ (another LR schedule)
    last = df[(df["step"] == 2) & (df["probe"] == "loss") & (df["metric"] == "loss")].set_index("run")["value"]
    assert last[forks[0]] != last[forks[1]]
    correlations = json.loads((out / "correlations.json").read_text())
    assert {(c["x"], c["controls"]) for c in correlations} >= {("trace", ""), ("lambda_max", "lr")}
    assert json.loads((out / "report.json").read_text())["checkpoints"] == 4  # (run, checkpoint) pairs
    assert json.loads((out / "report.json").read_text())["runs"] == 2
    assert (out / "landscape.html").stat().st_size > 10_000
    lines = table(out).splitlines()
    assert len(lines) == 2 + 4 and lines[2].startswith("| constant-n2-s0 | 0 |")


def _parse(spec: str):
    from losslens.lm.quant.spec import QuantSpec

    return QuantSpec.parse(spec)
