"""`losslens landscape` (losslens.cli.landscape_command) on the tiny trajectories: called as a function and
through the CLI, its JSON against the Python API and direct loss evaluations, its page, its
progress lines, and bad input refused in one line with exit status 2."""

from __future__ import annotations

import json
import shutil

import pytest
import typer
from typer.testing import CliRunner

from losslens.lm.checkpoints import CheckpointLoader, Trajectory
from losslens.cli.app import app
from losslens.cli.landscape_command import landscape
from losslens.lm.core.next_token_loss import evaluate
from losslens.lm.data import default_token_sets
from losslens.study.landscape.trajectory_landscapes import LandscapeSettings
from tests.fixtures_trajectory import tiny_trajectory_dir


@pytest.fixture(scope="module")
def folders():
    return tiny_trajectory_dir(), tiny_trajectory_dir(seed=1)


def test_function_prints_json_equal_to_the_api_and_direct_losses(folders, tmp_path, capsys):
    from losslens.study.landscape.trajectory_landscape import trajectory_landscape

    a, b = folders
    page = tmp_path / "land.html"
    settings = LandscapeSettings(spec="rtn:2:g32", grid=3, quick=True, out=page, quiet=True)
    landscape([str(a), str(b)], settings=settings, as_json=True)
    out = json.loads(capsys.readouterr().out)
    trajs = [Trajectory.from_folder(a), Trajectory.from_folder(b)]
    ev = default_token_sets(trajs[0], quick=True)["eval"]
    api = trajectory_landscape(trajs, ev, spec="rtn:2:g32", grid=None).describe()
    assert out["pca"]["explained_variance_ratio"] == pytest.approx(api["pca"]["explained_variance_ratio"], rel=1e-12)
    assert len(out["pca"]["checkpoints"]) == 6 and len(out["quantized"]) == 6
    for got, want in zip(out["pca"]["checkpoints"] + out["quantized"], api["pca"]["checkpoints"] + api["quantized"]):
        assert got["label"] == want["label"]
        assert got["coords"] == pytest.approx(want["coords"], rel=1e-9, abs=1e-12)
        assert got["relative_residual"] == pytest.approx(want["relative_residual"], rel=1e-9, abs=1e-12)
    # the own loss of a checkpoint is its loss evaluated directly on the same eval set
    ref = trajs[1][-1]
    row = next(r for r in out["pca"]["checkpoints"] if r["label"].endswith(f"/{ref.label}") and "s1" in r["label"])
    assert row["own_loss"] == pytest.approx(evaluate(CheckpointLoader(trajs[1]).load(ref), ev).loss, rel=1e-9)
    assert all(r["plane_loss"] is not None for r in out["quantized"])
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and 'data-figure="landscape"' in html and "off plane %" in html


def test_cli_writes_the_page_prints_progress_and_a_point_per_line(folders, tmp_path):
    a, _ = folders
    page = tmp_path / "one.html"
    result = CliRunner().invoke(
        app,
        [
            "landscape",
            str(a),
            "--grid",
            "3",
            "--quick",
            "--out",
            str(page),
            "--axes",
            "1,0",
            "--center",
            "step-000040",
            "--params",
            "*layers*",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "[landscape] principal axes of 3 checkpoints" in result.stderr
    assert "explained variance: PC1" in result.stdout and f"wrote {page}" in result.stdout
    lines = [ln for ln in result.stdout.splitlines() if "off the plane" in ln]
    assert [ln.split(":")[0] for ln in lines] == ["step-000020", "step-000040", "step-000060"]
    x, y = (float(v) for v in lines[1].split("(")[1].split(")")[0].split(","))
    assert (x, y) == (0.0, 0.0) and "0.0% off the plane" in lines[1]  # the centre sits at the origin
    assert page.is_file()


def test_too_few_checkpoints_is_one_line_and_exit_2(folders, tmp_path):
    a, _ = folders
    two = tmp_path / "two"
    shutil.copytree(a, two)
    shutil.rmtree(two / "step-000060")
    result = CliRunner().invoke(
        app, ["landscape", str(two), "--k", "2", "--grid", "3", "--quick", "--out", str(tmp_path / "x.html")]
    )
    assert result.exit_code == 2, result.output
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: 2 checkpoint(s)") and "--k 2 needs 3" in err[0]
    assert not (tmp_path / "x.html").exists()
    with pytest.raises(typer.Exit) as info:  # the function itself: the same exit
        landscape([str(two)], settings=LandscapeSettings(grid=3, quick=True, out=tmp_path / "x.html", quiet=True))
    assert info.value.exit_code == 2


@pytest.mark.parametrize(
    "args, said",
    [(["--axes", "0,2"], "--axes"), (["--spec", "rtn:99:zz"], "--spec"), (["--center", "nowhere"], "center 'nowhere'")],
)
def test_bad_options_are_refused_in_one_line(folders, tmp_path, args, said):
    a, _ = folders
    result = CliRunner().invoke(
        app, ["landscape", str(a), "--grid", "3", "--quick", "--quiet", "--out", str(tmp_path / "x.html"), *args]
    )
    assert result.exit_code == 2, result.output
    err = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error:") and said in err[0], err


def test_report_section_lists_variance_and_exactly_the_points_off_the_plane(folders, tmp_path, monkeypatch):
    """build_report(landscape=...): the figure, the explained variance of every axis and, in the
    off-plane table, exactly the points whose residual exceeds the threshold (here 30%, between the
    first checkpoints' ~32-41% and the others' 10-26%), the others not."""
    import re

    from losslens.study.landscape.trajectory_landscape import residual_flags, trajectory_landscape
    from losslens.study.report.figures import synthetic_results
    from losslens.study.report import landscape_section
    from losslens.study.report.pages import build_report

    a, b = folders
    trajs = [Trajectory.from_folder(a), Trajectory.from_folder(b)]
    ev = default_token_sets(trajs[0], quick=True)["eval"]
    land = trajectory_landscape(trajs, ev, spec="rtn:2:g32", grid=3)
    monkeypatch.setattr(landscape_section, "OFF_PLANE", 0.3)
    out = build_report(synthetic_results(n_checkpoints=4, runs=("wsd",)), tmp_path / "r.html", landscape=land)
    html = out.read_text()
    section = html.split('<section id="landscape">')[1].split("</section>")[0]
    assert 'data-figure="landscape"' in section and ">Landscape of the runs</h2>" in html
    for j, r in enumerate(land.pca.explained_variance_ratio):
        assert f"<td>PC{j + 1}</td>" in section.replace(' class="l"', "").replace(' class=""', "")
        assert f"{100 * r:.4g}" in section or f"{round(100 * r, 3):.4g}" in section
    table = section.split("Points off the plane</h3>")[1]
    listed = set(re.findall(r'<td class="l">([^<]*(?:step|⊙)[^<]*)</td>', table))
    flags = residual_flags(land, 0.3)
    flagged = {lab for lab, off in flags.items() if off}
    assert 0 < len(flagged) < len(flags) and listed == flagged
