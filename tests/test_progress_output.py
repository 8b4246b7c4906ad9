"""Issue #49 items 1 and 3: progress on long commands (plain lines in a pipe, a planned line, nothing on
stdout, ``--quiet``), no ``nan`` in descriptive rows, losslens warnings as one line. Help at 80 columns:
test_help_columns.py; the other long commands through a pipe: test_progress_pipes.py."""

from __future__ import annotations

import io
import json
import math
import os
import re
import subprocess
import sys
import warnings

import pytest
from typer.testing import CliRunner

from losslens.geometry.base.progress import Progress, plain_warnings, progress_bar
from tests.fixtures_trajectory import tiny_trajectory_dir

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # every control character but \t and \n


def test_plain_lines_in_a_pipe_planned_line_status_and_last_line():
    out = io.StringIO()
    with Progress(4, what="trace", unit="HVP", label="sharpness", stream=out, every=0.0) as bar:
        for _ in range(4):
            bar.update()
    text = out.getvalue()
    lines = text.splitlines()
    assert not CONTROL.search(text)
    assert re.fullmatch(r"\[sharpness\] planned: 4 HVPs for trace, ~\d+ s \(first HVP [0-9.e-]+ s\)", lines[0])
    assert lines[1].startswith("[sharpness] trace: 2/4 HVPs (50%), ") and "ETA" in lines[1]
    assert lines[3].startswith("[sharpness] trace: 4/4 HVPs (100%)") and "ETA" not in lines[3]
    assert re.fullmatch(r"\[sharpness\] trace: 4 HVPs in \d+:\d\d", lines[-1])


def test_quiet_and_false_print_nothing_a_callable_is_told_every_update():
    out = io.StringIO()
    with Progress(3, what="x", stream=out, every=0.0, quiet=True) as bar:
        bar.update(3)
    assert out.getvalue() == ""
    seen: list[int] = []
    with progress_bar(seen.append, 5, what="x") as bar:
        bar.update(2)
        bar.update()
    assert seen == [2, 1] and bar.done == 3
    parent = Progress(1, what="outer", stream=out, quiet=True)
    child = progress_bar(parent, 2, what="inner")
    child.update(2)
    child.close()
    assert out.getvalue() == "" and parent.done == 0


def test_interval_limits_the_lines():
    out = io.StringIO()
    with Progress(1000, what="grid", unit="point", stream=out, every=3600.0) as bar:
        for _ in range(1000):
            bar.update()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("planned: 1000 points") and lines[1].startswith("grid: 1000 points")


def test_sharpness_through_a_pipe_progress_on_stderr_json_on_stdout():
    traj = tiny_trajectory_dir()
    env = {**os.environ, "COLUMNS": "80", "LOSSLENS_PROGRESS_EVERY": "0"}
    cmd = [sys.executable, "-m", "losslens", "sharpness", str(traj), "--num-matvecs", "3", "--max-iter", "3"]
    cmd += ["--threads", "1", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["trace"]["num_matvecs"] == 3  # stdout: the JSON object and nothing else
    assert not CONTROL.search(r.stderr)
    lines = r.stderr.splitlines()
    assert any(re.match(r"\[sharpness\] planned: 3 HVPs for trace \(hutch\+\+\), ~", ln) for ln in lines), r.stderr
    assert any(ln.startswith("[sharpness] trace (hutch++): 3/3 HVPs (100%)") for ln in lines), r.stderr
    assert any(ln.startswith("[sharpness] planned: 4 HVPs for top-1 eigenvalues") for ln in lines), r.stderr


def test_sharpness_quiet_prints_no_progress():
    from losslens.cli.app import app

    traj = tiny_trajectory_dir()
    args = ["sharpness", str(traj), "--num-matvecs", "3", "--max-iter", "2", "--threads", "1", "--quiet", "--json"]
    r = CliRunner().invoke(app, args, env={"COLUMNS": "80", "LOSSLENS_PROGRESS_EVERY": "0"})
    assert r.exit_code == 0, r.output
    assert "[sharpness]" not in r.stderr and "planned" not in r.stderr
    assert json.loads(r.stdout)["eigen"]["num_matvecs"] >= 1


def test_descriptive_rows_say_why_and_print_no_nan():
    from losslens.study.demo.demo_study import _correlation_line
    from losslens.study.analysis.correlation import Correlation

    nan = math.nan
    row = {"method": "spearman", "x": "trace", "y": "rtn-w4", "controls": "", "r": 0.41, "r_within": nan}
    row |= {"ci_low": nan, "ci_high": nan, "p": nan, "inference": "descriptive", "n": 9, "n_eff": nan}
    row["note"] = "descriptive: no run has a correlation of its own"
    line = _correlation_line(row)
    assert "nan" not in line.lower() and "descriptive: no run has a correlation of its own" in line
    assert line.count("descriptive") == 1
    kw = dict(p=nan, ci_low=nan, ci_high=nan, n=9, n_excluded=0, r_within=nan, inference="descriptive")
    text = str(Correlation(method="spearman", r=0.41, **kw))
    assert "nan" not in text.lower() and "descriptive" in text


def test_losslens_warnings_are_one_line_without_file_and_line():
    from losslens.study.monitor.monitor import QuantizationAlarm

    err = io.StringIO()
    before = warnings.showwarning
    try:
        plain_warnings()
        warnings.showwarning("ΔQ rises\nfaster than the loss falls", QuantizationAlarm, "/x/monitor.py", 294, err)
    finally:
        warnings.showwarning = before
    assert err.getvalue() == "warning: ΔQ rises; faster than the loss falls\n"


def test_a_live_bar_keeps_the_label_and_the_planned_line():
    out = io.StringIO()
    with Progress(5, what="trace", unit="HVP", label="sharpness", stream=out, live=True) as bar:
        bar.describe("step-000060")
        bar.update(5)
    text = out.getvalue()
    assert text.startswith("[sharpness] planned: 5 HVPs for trace, ")
    assert "[sharpness] trace: step-000060" in text and "5/5" in text


@pytest.mark.parametrize(
    "command, args, unit",
    [
        ("quantize", ["--spec", "gptq:4:g32", "--quick", "--json"], "layers"),
        ("explain", ["--spec", "rtn:3:row", "--quick", "--trace-hvps", "4", "--json"], "spec"),
        ("surface", ["--spec", "rtn:3:row", "--grid", "3"], "points"),
    ],
)
def test_long_commands_through_a_pipe(command, args, unit, tmp_path):
    """quantize (GPTQ layers), explain (specs measured) and surface (grid points) print plain progress
    lines on stderr in a pipe, a planned line first; under --json stdout holds only the JSON."""
    traj = tiny_trajectory_dir()
    env = {**os.environ, "COLUMNS": "80", "LOSSLENS_PROGRESS_EVERY": "0"}
    target = [str(traj / "step-000060")]
    if command == "surface":
        args = [*args, "--out", str(tmp_path / "surface.html")]
    r = subprocess.run(
        [sys.executable, "-m", "losslens", command, *target, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,  # explain writes explain.json into the working folder
    )
    assert r.returncode == 0, r.stderr
    assert not CONTROL.search(r.stderr), r.stderr
    lines = r.stderr.splitlines()
    assert any(re.search(rf"planned: \d+ {unit}", ln) for ln in lines), r.stderr
    assert any("(100%)" in ln or re.search(rf"\d+ {unit} in \d+:\d\d", ln) for ln in lines), r.stderr
    if "--json" in args:
        text = r.stdout.strip()
        rows = [json.loads(ln) for ln in text.splitlines()] if command == "quantize" else [json.loads(text)]
        assert rows and all(isinstance(row, dict) for row in rows)
