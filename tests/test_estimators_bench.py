"""Smoke test of benchmarks/estimators.py in --quick mode (MLP with an exact Hessian only)."""

from __future__ import annotations

import json

import pytest

from benchmarks.estimators import format_table, main


@pytest.mark.slow
def test_estimators_benchmark_quick(tmp_path, capsys):
    out = tmp_path / "rows.json"
    rows = main(["--quick", "--json", str(out)])
    assert [r["budget"] for r in rows] == [10, 30, 100, 300]
    assert all(r["problem"] == "mlp-exact" and r["seeds"] == 5 for r in rows)
    assert json.loads(out.read_text()) == rows
    for r in rows:
        assert r["hutchinson_rel_err"] > 0 and r["hutchpp_rel_err"] > 0
        assert r["ratio"] == r["hutchinson_rel_err"] / r["hutchpp_rel_err"]
    # at large budgets Hutch++ wins on a trained net's Hessian (measured ratio ≈ 5-6)
    assert rows[-1]["ratio"] > 2
    assert "ratio" in capsys.readouterr().out and "hutch++" in format_table(rows)
