"""Smoke test of ``benchmarks/first_progress.py`` (issue #49): it reads a long command's stderr through a
pipe and finds its first progress line and its first ``planned:`` line, in that order, before the exit.
No time is asserted (the seconds are the benchmark's, benchmarks/README.md)."""

from __future__ import annotations

from benchmarks import first_progress
from tests.fixtures_trajectory import tiny_trajectory_dir


def test_first_progress_bench_finds_the_first_and_the_planned_line(tmp_path):
    ckpt = tiny_trajectory_dir() / "step-000060"
    args = ["sharpness", str(ckpt), "--quick", "--num-matvecs", "6", "--max-iter", "4", "--threads", "1"]
    rows = first_progress.main([str(ckpt), "--repeats", "1", "--json", str(tmp_path / "rows.json"), "--", *args])
    (row,) = rows
    assert row["first_line"].startswith("[sharpness] ") and "planned:" not in row["first_line"]
    assert 0 < row["first_line_s"] < row["planned_line_s"] < row["total_s"]
    assert (tmp_path / "rows.json").read_text().count("first_line_s") == 1
