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


# --- what a reader sees: the terminal table, and skipped vs failed ------------------------------


def _table_rows(text: str) -> tuple[list[str], list[dict[str, str]]]:
    """The header's column names and, per table row (its first line), the text of each column and
    the section whose heading it is under."""
    lines = text.splitlines()
    names, dashes = lines[0].split(), lines[1]
    spans, i = [], 0
    for run_ in dashes.split(" "):
        if run_:
            spans.append((i, i + len(run_)))
        i += len(run_) + 1
    out, section = [], None
    for line in lines[2:]:
        if not line.strip():
            break  # the legend follows the table
        if not line.startswith(" "):
            section = line  # a section's heading
        elif not line.startswith("    ") and line[spans[-1][0] : spans[-1][1]].strip():
            # a row's first line: the status is filled (a status never wraps; a note starts further in)
            out.append({"section": section, **{n: line[a:b].strip() for n, (a, b) in zip(names, spans)}})
    return names, out


def _bench_gpu_through_a_pipe(monkeypatch, rows, *args: str) -> str:
    """`losslens bench gpu --device cpu --quick ARGS` through CliRunner (stdout is not a terminal),
    the check's run replaced by ``rows``."""
    import benchmarks.gpu as gpu
    from typer.testing import CliRunner

    from losslens.cli.app import app

    def fake_run(quick=False, device=None, budget=480.0):
        return [dict(r) for r in rows]

    monkeypatch.setattr(gpu, "run", fake_run)
    result = CliRunner().invoke(app, ["bench", "gpu", "--device", "cpu", "--quick", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_the_table_in_a_pipe_fits_80_columns_and_fills_every_cell_the_json_has(rows, monkeypatch, tmp_path):
    from benchmarks.gpu.table import num

    monkeypatch.delenv("COLUMNS", raising=False)
    out = _bench_gpu_through_a_pipe(monkeypatch, rows, "--markdown", str(tmp_path / "gpu.md"))
    assert len((tmp_path / "gpu.md").read_text().splitlines()) == len(rows) + 2  # the wide table: every field
    table = out[out.index("  what ") :]
    assert all(len(line) <= 80 for line in out.splitlines()), max(out.splitlines(), key=len)
    assert not set(table) & set("─│┃┏┓┗┛━┡┩╇┼┬┴")  # plain text: no box drawing
    names, parsed = _table_rows(table)
    assert names == ["what", "on", "result", "time", "status"]
    assert len(parsed) == len(rows)
    for row, cells in zip(rows, parsed):
        assert cells["section"] == row["section"] and cells["status"] == row["status"]
        assert cells["what"] and row["what"].startswith(cells["what"].rstrip("…"))
        if "value" in row:
            assert cells["result"] and cells["result"].startswith(num(row["value"])), (row, cells)
        if any(k in row for k in ("seconds", "s_per_gradient", "device_s")):
            assert cells["time"], (row, cells)
        if "shape" in row or "dtype" in row:
            assert cells["on"], (row, cells)
        if any(k in row for k in ("reverse_grads", "allocated_over_plan", "checkpoints", "kernels", "error")):
            assert cells["result"], (row, cells)
    assert {c["section"] for c in parsed} >= {name for name, *_ in SECTIONS}


def test_the_table_follows_columns_and_stays_readable_when_narrow(rows, monkeypatch):
    from benchmarks.gpu.table import terminal_table, terminal_width

    monkeypatch.setenv("COLUMNS", "120")
    assert terminal_width() == 120
    wide = terminal_table(rows)
    assert max(len(line) for line in wide.splitlines()) <= 120
    for width in (80, 50):
        text = terminal_table(rows, width)
        assert all(len(line) <= width for line in text.splitlines())
        assert all(f"\n{name}" in text for name, *_ in SECTIONS)


def test_a_missing_optional_package_is_skipped_with_its_install_line(monkeypatch):
    import sys

    from benchmarks.gpu.table import terminal_table

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if lm-eval were not installed
    out = run(quick=True, device="cpu", budget=600, sections=("accuracy",), progress=None)
    acc = [r for r in out if r["section"] == "accuracy" and r["what"] != "section seconds"]
    assert [r["status"] for r in acc] == ["skipped"] and not failures(out)
    assert acc[0]["install"] == "pip install 'losslens[eval]'" and "lm_eval" in acc[0]["reason"]
    text = terminal_table(out, 80)
    assert "pip install 'losslens[eval]'" in text and "skipped" in text


def test_a_section_meeting_an_absent_optional_package_is_skipped(monkeypatch):
    import sys

    import benchmarks.gpu.agreement as agreement

    def needs_gguf(ctx):
        import gguf  # noqa: F401

    monkeypatch.setitem(sys.modules, "gguf", None)
    monkeypatch.setattr(agreement, "attention", needs_gguf)
    out = run(quick=True, device="cpu", budget=600, sections=("attention",), progress=None)
    assert [r["status"] for r in out if r["section"] == "attention"] == ["skipped", "info"]
    assert out[1]["install"] == "pip install 'losslens[gguf]'"


@pytest.mark.parametrize(
    "planted",
    [
        RuntimeError("planted"),
        ModuleNotFoundError("No module named 'losslens.measure.gone'", name="losslens.measure.gone"),
        ImportError("cannot import name 'evaluate' from 'lm_eval'", name="lm_eval"),
        ModuleNotFoundError("No module named 'lm_eval.evaluator'", name="lm_eval.evaluator"),
    ],
    ids=["error", "losslens-module", "import-error-in-lm_eval", "lm_eval-submodule"],
)
def test_a_failure_in_the_accuracy_section_is_failed_not_skipped(monkeypatch, tmp_path, planted):
    import sys
    import types

    import benchmarks.gpu.workloads as workloads
    from losslens.lm.checkpoints import Trajectory

    def broken(*args, **kwargs):
        raise planted

    # lm_eval present (the real one, or a stand-in where the eval extra is not installed)
    monkeypatch.setitem(sys.modules, "lm_eval", sys.modules.get("lm_eval") or types.ModuleType("lm_eval"))
    monkeypatch.setattr(workloads, "_tiny_run", lambda ctx: tmp_path)
    monkeypatch.setattr(Trajectory, "from_folder", broken)  # losslens code raising inside the section
    out = run(quick=True, device="cpu", budget=600, sections=("accuracy",), progress=None)
    failed = failures(out)
    assert [r["section"] for r in failed] == ["accuracy"] and str(planted) in failed[0]["error"]
    assert not any(r["status"] == "skipped" for r in out)
