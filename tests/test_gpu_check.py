"""The one-command GPU check (benchmarks/gpu) in its CPU smoke mode: every section runs at toy size
on the CPU and agrees, so the script cannot rot between GPU runs (no timing is asserted)."""

from __future__ import annotations

import pytest

from benchmarks.gpu import SECTIONS, failures, markdown, run


@pytest.fixture(scope="module")
def rows():
    return run(quick=True, device="cpu", budget=1200, progress=None)


def test_every_section_runs_on_the_cpu_and_agrees(rows):
    assert not failures(rows), failures(rows)
    ran = {r["section"] for r in rows if r["what"] != "section seconds"}
    assert ran >= {name for name, *_ in SECTIONS}
    checks = [r for r in rows if "tolerance" in r]
    assert len(checks) >= 6 * 8 + 4 and all(r["status"] == "ok" for r in checks)
    kinds = {r["section"]: r for r in rows if r["section"] == "attention" and "kernels" in r}
    assert kinds["attention"]["kernels"]  # which SDPA kernel ran is recorded


def test_markdown_table_has_one_line_per_row(rows):
    table = markdown(rows).splitlines()
    assert table[0].startswith("| section | what | status") and len(table) == len(rows) + 2


def test_a_failing_section_is_recorded_and_the_others_still_run(monkeypatch):
    import benchmarks.gpu.agreement as agreement

    def broken(ctx):
        raise RuntimeError("planted")

    monkeypatch.setattr(agreement, "attention", broken)
    out = run(quick=True, device="cpu", budget=600, sections=("attention", "fsdp"), progress=None)
    failed = failures(out)
    assert [r["section"] for r in failed] == ["attention"] and "planted" in failed[0]["error"]
    assert any(r["section"] == "fsdp" and r["status"] == "ok" for r in out)


def test_without_cuda_and_no_device_nothing_is_measured():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    out = run(progress=None)
    assert len(out) == 1 and out[0]["status"] == "skipped"


def test_a_spent_budget_skips_the_remaining_sections():
    out = run(quick=True, device="cpu", budget=0, progress=None)
    assert {r["status"] for r in out if r["section"] != "all"} == {"skipped"}
