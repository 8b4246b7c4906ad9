"""Failures that used to pass quietly (issue #24, item 2) are now an error, a failed row, or a note
that the report flags. Each test fails on the code before the change."""

from __future__ import annotations

import importlib
import json

import pandas as pd
import pytest
import torch

from losslens.geometry.surfaces.grid import GridSpec
from losslens.geometry.surfaces.point_planes import plane_through_points
from losslens.geometry.surfaces.surface import SurfaceError, evaluate_surface
from losslens.study.analysis import AnalysisError, analyse
from losslens.lm.checkpoints import Trajectory
from losslens.lm.checkpoints.errors import CorruptCheckpointError
from losslens.lm.core.next_token_loss import lm_loss
from tests.test_analysis import _tidy
from tests.tiny_models import micro_gptneox, random_batches


def test_analyse_raises_a_bug_and_notes_a_data_problem(monkeypatch):
    """summary.analyse turned *any* exception into "correlations unavailable"; a bug must surface."""
    summary_mod = importlib.import_module(
        "losslens.study.analysis.summary"
    )  # the module (the package exports the function)
    df = _tidy()

    def broken(*a, **k):
        raise ZeroDivisionError("a bug in the statistics")

    monkeypatch.setattr(summary_mod, "summary", broken)
    with pytest.raises(ZeroDivisionError):
        summary_mod.analyse(df, n_boot=50)

    def unusable(*a, **k):
        raise AnalysisError("the results table is empty")

    monkeypatch.setattr(summary_mod, "summary", unusable)
    corr, _phases, notes = summary_mod.analyse(df, n_boot=50)
    assert corr is None and notes == ["correlations not computed: the results table is empty"]


def test_analyse_pools_runs_with_runs_as_groups():
    a, b = _tidy(), _tidy()
    b["run"] = "u"
    corr, phases, notes = analyse(pd.concat([a, b], ignore_index=True), n_boot=50)
    assert (corr["n_runs"] == 2).all() and (corr["n"][corr["note"].str.len() == 0] == 22).all()
    assert any("pool the checkpoints of 2 runs" in n for n in notes)


def test_sweep_summary_says_why_there_is_no_lr_control(monkeypatch):
    """commands/sweep.correlation_summary dropped the partial correlation on LR silently."""
    from losslens.cli import sweep_command as cmd

    df = _tidy()
    df["lr"] = 1e-3  # constant LR: no partial correlation on it
    tab = cmd.correlation_summary(df, n_boot=50)
    assert (tab["controls"] == "").all()
    assert any("no partial correlation on lr" in n and "constant" in n for n in tab.attrs["notes"])
    df["lr"] = float("nan")
    tab = cmd.correlation_summary(df, n_boot=50)
    assert any("no partial correlation on lr" in n for n in tab.attrs["notes"])
    # with a usable LR the control is there and nothing is noted
    tab = cmd.correlation_summary(_tidy(), n_boot=50)
    assert (tab["controls"] == "lr").any() and tab.attrs["notes"] == []

    def broken(*a, **k):
        raise KeyError("a bug")

    monkeypatch.setattr("losslens.study.analysis.series", broken)
    with pytest.raises(KeyError):  # not swallowed into "no control"
        cmd.correlation_summary(_tidy(), n_boot=50)


def test_unreadable_trainer_state_is_an_error(tmp_path):
    """trajectory.py only warned: the LRs and tokens then silently went missing."""
    from tests.test_checkpoints import _neox, _save

    model = _neox()
    for s in (10, 20):
        _save(model, tmp_path / f"checkpoint-{s}")
    (tmp_path / "checkpoint-20" / "trainer_state.json").write_text('{"global_step": 20, "log_history": [')
    with pytest.raises(CorruptCheckpointError, match=r"checkpoint-20/trainer_state.json is not valid JSON.*--schedule"):
        Trajectory.from_folder(tmp_path)
    (tmp_path / "checkpoint-20" / "trainer_state.json").write_text(
        json.dumps({"log_history": [{"step": 20, "learning_rate": 1e-4}]})
    )
    assert Trajectory.from_folder(tmp_path)[1].lr == pytest.approx(1e-4)


def test_get_loader_does_not_swallow_a_failed_trajectory_update(monkeypatch):
    """runner.get_loader had a bare `except Exception: pass` around giving the cached loader the
    trajectory (with its new LAWA checkpoints): a loader that cannot take it would load stale refs."""
    from losslens.study.sweep import runner

    class Stubborn:
        @property
        def trajectory(self):
            return None

        @trajectory.setter
        def trajectory(self, value):
            raise AttributeError("this loader cannot change its trajectory")

    class Traj:
        name = "t"

        def __len__(self):
            return 1

        def __getitem__(self, i):
            return type("Ref", (), {"location": "x"})()

    traj = Traj()
    key = ("t", "x", "None", "None", False)
    monkeypatch.setattr(runner, "_LOADERS", {key: Stubborn()})
    with pytest.raises(AttributeError, match="cannot change its trajectory"):
        runner.get_loader(traj)


def test_nonfinite_loss_at_a_marked_point_is_an_error():
    """surface.py only warned when A, B or C had a NaN loss, and returned a surface around nothing."""
    model = micro_gptneox(seed=0, dtype=torch.float32)
    A = {n: p.detach().clone() for n, p in model.named_parameters()}
    B = {n: v + 0.01 for n, v in A.items()}
    C = {n: torch.round(v * 4) / 4 for n, v in A.items()}
    batches = random_batches(n_batches=1, batch=2, seq=8, seed=0)
    plane = plane_through_points(A, B, C)
    first = next(iter(A))

    def nan_at_b(m, b):  # NaN exactly where the weights are B's (recognised by one tensor)
        val = lm_loss(m, b)
        at_b = torch.allclose(dict(m.named_parameters())[first], B[first], rtol=0, atol=1e-6)
        return val * float("nan") if at_b else val

    with pytest.raises(SurfaceError, match=r"marked point\(s\) \['B'\] is not finite"):
        evaluate_surface(model, nan_at_b, batches, plane, GridSpec(resolution=2))
    s = evaluate_surface(model, lm_loss, batches, plane, GridSpec(resolution=2))  # and the model was restored
    assert all(torch.equal(p, A[n]) for n, p in model.named_parameters()) and s.n_nonfinite == 0
