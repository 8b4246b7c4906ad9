"""Issue #49 item 1, the rest of the long commands through a pipe: ``landscape``, ``accuracy``, ``sweep``,
``fork`` and ``train-tiny`` print plain progress lines on stderr (a planned line first, the last units
done, no control characters), stdout holds only their results (under ``--json`` only the JSON), and
``--quiet`` silences the progress. Each runs on the shared tiny trajectory in a few seconds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from tests.fixtures_trajectory import data_cache_dir, tiny_trajectory_dir

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # every control character but \t and \n
PLAN = (
    'name = "pipe"\nseed = 0\n[data]\neval = [2, 2, 32]\ncurvature = [1, 2, 32]\n[probes]\nloss = true\n'
    'quant = ["rtn:4"]\ntrace = { method = "hutchinson", num_matvecs = 4 }\n'
)


def _args(command: str, tmp_path) -> tuple[list[str], str, str]:
    """The command line of ``command`` at its smallest, its progress label and unit."""
    traj = tiny_trajectory_dir()
    if command == "landscape":
        return [str(traj), "--grid", "3", "--quick", "--out", str(tmp_path / "l.html"), "--json"], "landscape", "points"
    if command == "accuracy":
        args = [str(traj / "step-000060"), "-s", "rtn:3:row", "-s", "rtn:4:row", "--limit", "8", "--n-boot", "10"]
        return [*args, "--json"], "accuracy", "variants"
    if command in ("sweep", "sweep-workers"):
        (tmp_path / "plan.toml").write_text(PLAN)
        args = [str(traj), "--plan", str(tmp_path / "plan.toml"), "--out", str(tmp_path / "s.sqlite")]
        workers = "2" if command == "sweep-workers" else "1"
        return [*args, "--threads", "1", "--workers", workers, "--json"], "sweep", "rows"
    if command == "fork":
        args = [str(traj), "--at", "step-000040", "--steps", "4", "--checkpoints", "2", "--restart-moments"]
        return [*args, "--out", str(tmp_path / "forks")], "fork", "steps"
    args = ["--tiny", "--steps", "6", "--checkpoints", "2", "--out", str(tmp_path / "run")]
    return [*args, "--data-dir", str(data_cache_dir())], "train-tiny", "steps"


@pytest.mark.parametrize("command", ["landscape", "accuracy", "sweep", "sweep-workers", "fork", "train-tiny"])
def test_progress_through_a_pipe(command, tmp_path):
    if command == "accuracy":
        pytest.importorskip("lm_eval")
    args, label, unit = _args(command, tmp_path)
    env = {**os.environ, "COLUMNS": "80", "LOSSLENS_PROGRESS_EVERY": "0"}
    r = subprocess.run(
        [sys.executable, "-m", "losslens", command.removesuffix("-workers"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert not CONTROL.search(r.stderr), r.stderr
    lines = r.stderr.splitlines()
    assert any(re.match(rf"\[{label}\] planned: \d+ {unit} for .+, ~\d", ln) for ln in lines), r.stderr
    done = [ln for ln in lines if re.match(rf"\[{label}\] .+: \d+/\d+ {unit} \(\d+%\)", ln)]
    assert any("ETA" in ln for ln in done), r.stderr
    assert "(100%)" in done[-1] and re.search(rf"\[{label}\] .+: \d+ {unit} in \d+:\d\d$", r.stderr, re.M)
    assert f"[{label}]" not in r.stdout and "planned:" not in r.stdout  # progress never on stdout
    if "--json" in args:
        text = r.stdout.strip()
        rows = [json.loads(ln) for ln in text.splitlines()] if command == "accuracy" else [json.loads(text)]
        assert rows and all(isinstance(row, dict) for row in rows)
    if command.startswith("sweep"):  # inside a row: its products, from this process or from a worker
        assert re.search(r"^\[sweep\] step-\d+ · trace hutchinson: \d/4 HVPs.*, set-up [\d.e+-]+ s", r.stderr, re.M)
    if command == "sweep-workers":  # issue 49: the plan is not extrapolated from the workers' start-up
        planned = next(ln for ln in lines if "planned:" in ln)
        assert re.search(r"on 2 workers, ~\d+ s \(first row [\d.e-]+ s; not counted: [\d.e+-]+ s of start-up", planned)
        finished = [ln for ln in lines if re.match(r"\[sweep\] checkpoint step-\d+ done \(\d/3\)", ln)]
        assert len(finished) == 3 and all(re.search(r", ~\d+:\d\d left$", ln) for ln in finished[:2]), r.stderr


def _row(probe: str, seconds: float, load: float | None = None, status: str = "ok"):
    from losslens.measure.probes.rows import ProbeRow

    return ProbeRow("c", probe, "", status, extra={} if load is None else {"load_seconds": load}, seconds=seconds)


def test_sweep_estimate_counts_measured_rows_and_warm_loads_not_start_up(capsys):
    """Issue 49: the sweep's time left comes from the rows' own seconds per probe and the loads after
    each worker's first, over the workers busy; the wall time before the first row (start-up, the
    first loads that import the model's code) is named, never extrapolated."""
    from losslens.study.sweep.progress import SweepProgress

    keys = [("loss", ""), ("trace", "")]
    bar = SweepProgress(6, 3, workers=2, pending=[keys, keys, keys])
    assert bar.seconds_left() is None
    bar.measured(_row("loss", 1.0, load=20.0))  # a worker's first checkpoint: a slow first load
    bar.probe_done()
    planned = capsys.readouterr().err.splitlines()[0]
    assert re.match(
        r"\[sweep\] planned: 6 rows for probe rows on 2 workers, ~3 s \(first row 1 s; not counted: ", planned
    )
    # left: loss ×2 at 1 s, trace ×3 at the mean row (1 s), loads not yet measured warm: 5 s over 2 workers
    assert bar.seconds_left() == pytest.approx(2.5)
    bar.measured(_row("trace", 3.0))
    bar.probe_done()
    bar.checkpoint_done("c1")  # loss ×2 at 1 s + trace ×2 at 3 s = 8 s over 2 workers
    assert bar.seconds_left() == pytest.approx(4.0)
    assert capsys.readouterr().err.splitlines()[-1] == "[sweep] checkpoint c1 done (1/3), ~0:04 left"
    bar.measured(_row("loss", 3.0, load=18.0))  # the other worker's first load: not a warm one
    bar.measured(_row("trace", 5.0))
    bar.probe_done(2)
    bar.checkpoint_done("c2")  # loss at 2 s + trace at 4 s, one checkpoint left: one worker busy
    assert bar.seconds_left() == pytest.approx(6.0)
    bar.measured(_row("loss", 0.0, load=0.5, status="failed"))  # a warm load counts; a failed row is done only
    assert bar._load() == pytest.approx(0.5) and bar.seconds_left() == pytest.approx(4.0)
    bar.close()


@pytest.mark.parametrize("command", ["fork", "train-tiny", "accuracy", "landscape"])
def test_quiet_prints_no_progress(command, tmp_path, monkeypatch):
    if command == "accuracy":
        pytest.importorskip("lm_eval")
    from losslens.cli.app import app

    args, label, _ = _args(command, tmp_path)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, [command, *args, "--quiet"], env={"COLUMNS": "80", "LOSSLENS_PROGRESS_EVERY": "0"})
    assert r.exit_code == 0, r.output
    assert f"[{label}]" not in r.stderr and "planned" not in r.stderr, r.stderr


def test_sweep_counts_each_running_rows_products_apart(capsys):
    """Issue #47: a whole-model curvature row runs minutes; its products are counted inside the row,
    per checkpoint (two workers' rows at once do not add up), with the set-up before the first product
    said apart from the time per product."""
    from losslens.measure.probes.tasks import make_task
    from losslens.study.sweep.progress import SweepProgress, _RowProducts

    row = _RowProducts("c1 · trace hutch++", 12)
    row.t0 = 0.0
    row.add(1, 3.0)  # the first product ends the set-up (building and checking the operator)
    row.add(2, 5.0)
    row.add(3, 25.0)  # 5 products after the first in 22 s
    assert row.status(25.0) == "c1 · trace hutch++: 6/12 HVPs, 4.4 s/HVP, set-up 3 s, elapsed 0:25"

    bar = SweepProgress(4, 2, workers=2)
    bar._p.every = 0.0  # a line per message
    trace = make_task("trace", "hutch++", {"num_matvecs": 12}, curvature=True)
    bar.start_probe("c1", trace)
    bar.start_probe("c2", trace)
    bar.products(1, "c1")
    bar.products(2, "c2")
    bar.products(3, "c1")
    assert (bar._running["c1"].n, bar._running["c2"].n) == (4, 2)
    err = capsys.readouterr().err.splitlines()
    assert [ln.split(",")[0] for ln in err] == [
        "[sweep] c1 · trace hutch++: 1/12 HVPs",
        "[sweep] c2 · trace hutch++: 2/12 HVPs",
        "[sweep] c1 · trace hutch++: 4/12 HVPs",
    ]
    bar.checkpoint_done("c1")
    bar.products(5, "c1")  # a late message of a finished checkpoint: ignored
    assert "c1" not in bar._running
    bar.close()
