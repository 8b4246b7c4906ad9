"""losslens.geometry.surfaces.surface: grid evaluation on a plane of a tiny HF GPT-NeoX, exactness at A/B/C, exact
restore of the model, NaN holes, resuming, figures and (de)serialisation."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch

from losslens.geometry.surfaces.grid import GridSpec
from losslens.geometry.surfaces.point_planes import line, plane_through_points
from losslens.geometry.surfaces.random_planes import random_plane
from losslens.geometry.surfaces.surface import Profile, Surface, SurfaceError, evaluate_line, evaluate_surface
from losslens.lm.core.next_token_loss import evaluate, lm_loss
from losslens.study.report.surface_figures import profile_figure, surface_figure, surface_profile_figure
from tests.tiny_models import micro_gptneox, random_batches

NB = 2  # batches per point


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def setup():
    """A float32 micro GPT-NeoX (SDPA attention) and three points: A, B = another 'checkpoint',
    C = A rounded to a grid of 1/4 (a crude 'quantized' A)."""
    model = micro_gptneox(seed=0, dtype=torch.float32, attn="sdpa")
    A = {n: p.detach().clone() for n, p in model.named_parameters()}
    other = micro_gptneox(seed=1, dtype=torch.float32)
    B = {n: A[n] + 0.3 * (p.detach() - A[n]) for n, p in other.named_parameters()}
    C = {n: torch.round(v * 4) / 4 for n, v in A.items()}
    batches = random_batches(n_batches=NB, batch=3, seq=10, seed=0)
    return model, A, B, C, batches


def _fresh(weights):
    m = micro_gptneox(seed=7, dtype=torch.float32, attn="sdpa")
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(weights[n])
    return m


def test_marked_points_equal_direct_evaluation(setup):
    model, A, B, C, batches = setup
    plane = plane_through_points(A, B, C)
    s = evaluate_surface(model, lm_loss, batches, plane, GridSpec(resolution=4))
    assert s.loss.shape == (4, 4) and set(s.points) == {"A", "B", "C"}
    for label, W in (("A", A), ("B", B), ("C", C)):
        direct = evaluate(_fresh(W), batches).loss
        got = s.points[label][2]
        assert abs(got - direct) / abs(direct) < 1e-6, (label, got, direct)
        assert s.points[label][:2] == pytest.approx(plane.coords[label])
    # the grid goes through the same code: a grid node placed exactly on B reproduces B's loss
    bx = plane.coords["B"][0]
    s2 = evaluate_surface(model, lm_loss, batches, plane, (np.array([0.0, bx]), np.array([0.0])))
    assert s2.loss[0, 1] == s.points["B"][2] and s2.loss[0, 0] == s.points["A"][2]


def test_model_restored_bit_exactly(setup):
    model, A, B, C, batches = setup
    plane = plane_through_points(A, B, C)
    with torch.no_grad():  # start away from the plane's origin
        for p in model.parameters():
            p.add_(0.01)
    before = _state(model)
    model.train()
    evaluate_surface(model, lm_loss, batches, plane, GridSpec(resolution=3))
    after = _state(model)
    assert model.training  # mode restored
    assert all(torch.equal(before[k], after[k]) for k in before)
    # also when the loss function fails mid-grid
    calls = {"n": 0}

    def boom(m, b):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("boom")
        return lm_loss(m, b)

    with pytest.raises(RuntimeError, match="boom"):
        evaluate_surface(model, boom, batches, plane, GridSpec(resolution=3))
    after = _state(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(A[n])
    model.eval()


def test_nan_losses_are_kept_counted_and_drawn_as_holes(setup):
    model, A, B, C, batches = setup
    plane = plane_through_points(A, B, C)
    calls = {"n": 0}
    bad_points = {2, 7}

    def flaky(m, b):
        if b.shape[0] < batches[0].shape[0]:  # the memory plan's 1- and 2-row forwards, before the grid
            return lm_loss(m, b)
        point = calls["n"] // NB
        calls["n"] += 1
        val = lm_loss(m, b)
        return val * float("nan") if point in bad_points else val

    with pytest.warns(RuntimeWarning, match="2 of 9 grid points gave a non-finite loss"):
        s = evaluate_surface(model, flaky, batches, plane, GridSpec(resolution=3))
    assert s.n_nonfinite == 2
    flat = s.loss.ravel()
    assert np.isnan(flat[2]) and np.isnan(flat[7]) and np.isfinite(np.delete(flat, [2, 7])).all()
    fig = surface_figure(s)
    z = fig.data[0].z
    assert z[0][2] is None and z[2][1] is None  # holes, not interpolated
    assert fig.data[1].connectgaps is False and fig.data[0].connectgaps is False
    assert "non-finite" in fig.layout.title.text
    d = json.loads(json.dumps(s.to_dict()))  # valid JSON (no NaN tokens)
    assert d["loss"][0][2] is None
    back = Surface.from_dict(d)
    np.testing.assert_array_equal(np.isnan(back.loss), np.isnan(s.loss))
    np.testing.assert_allclose(back.loss[np.isfinite(back.loss)], s.loss[np.isfinite(s.loss)])


def test_resume_skips_finished_rows(setup, tmp_path):
    model, A, B, C, batches = setup
    plane = plane_through_points(A, B, C)
    ck = tmp_path / "grid.npz"
    full = evaluate_surface(model, lm_loss, batches, plane, GridSpec(resolution=4))
    calls = {"n": 0}

    def dies(m, b):
        if b.shape[0] < batches[0].shape[0]:  # the memory plan's 1- and 2-row forwards
            return lm_loss(m, b)
        calls["n"] += 1
        if calls["n"] > 2 * 4 * NB + 1:  # two full rows, then die inside row 3
            raise KeyboardInterrupt
        return lm_loss(m, b)

    with pytest.raises(KeyboardInterrupt):
        evaluate_surface(model, dies, batches, plane, GridSpec(resolution=4), checkpoint_path=ck)
    assert ck.exists()
    counted = {"n": 0}

    def counting(m, b):
        counted["n"] += b.shape[0] == batches[0].shape[0]  # grid and marked points, not the plan's
        return lm_loss(m, b)

    resumed = evaluate_surface(model, counting, batches, plane, GridSpec(resolution=4), checkpoint_path=ck)
    assert resumed.meta["resumed_rows"] == 2
    assert counted["n"] == (2 * 4 + 3) * NB  # only the two missing rows and the three points
    np.testing.assert_array_equal(resumed.loss, full.loss)
    with pytest.raises(SurfaceError, match="different plane, grid or data"):
        evaluate_surface(model, lm_loss, batches, plane, GridSpec(resolution=5), checkpoint_path=ck)


def test_vmapped_and_merged_points_match_sequential(setup):
    model, A, B, C, batches = setup
    plane = plane_through_points(A, B, C)
    seq = evaluate_surface(model, lm_loss, batches, plane, GridSpec(resolution=3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SDPA has no vmap batching rule (slow fallback warning)
        vm = evaluate_surface(model, lm_loss, batches, plane, GridSpec(resolution=3), points_per_forward=2)
    np.testing.assert_allclose(vm.loss, seq.loss, rtol=1e-5)
    assert vm.points == seq.points
    merged = evaluate_surface(model, lm_loss, batches, plane, GridSpec(resolution=3), merge_batches=True)
    np.testing.assert_allclose(merged.loss, seq.loss, rtol=1e-6)
    assert merged.points == seq.points  # marked points are always evaluated batch by batch
    assert merged.meta["grid_forwards_per_point"] == 1
    with pytest.raises(SurfaceError, match="weights"):
        evaluate_surface(model, lm_loss, batches, plane, 2, merge_batches=True, weights=[1, 1])
    with pytest.raises(SurfaceError, match="one shape"):
        evaluate_surface(model, lm_loss, [batches[0], batches[1][:, :5]], plane, 2, merge_batches=True)


def test_random_plane_and_line(setup):
    model, A, B, C, batches = setup
    rp = random_plane(A, seed=0, label="A")
    s = evaluate_surface(model, lm_loss, batches, rp, GridSpec(resolution=3))
    direct = evaluate(_fresh(A), batches).loss
    assert s.points["A"][2] == pytest.approx(direct, rel=1e-6)
    assert s.loss[1, 1] == s.points["A"][2]  # (0, 0) is the centre node of a 3×3 grid over [-1, 1]
    assert s.plane["kind"] == "random"
    ln = line(A, end=B)
    prof = evaluate_line(model, lm_loss, batches, ln, 5)
    assert isinstance(prof, Profile) and len(prof.x) == 5
    assert prof.points["B"][1] == pytest.approx(evaluate(_fresh(B), batches).loss, rel=1e-6)
    fig = profile_figure(prof)
    assert [t.name for t in fig.data] == ["loss", "points"]
    assert Profile.from_dict(json.loads(json.dumps(prof.to_dict()))).points.keys() == prof.points.keys()


def test_figure_has_surface_contour_and_marked_points(setup):
    model, A, B, C, batches = setup
    plane = plane_through_points(A, B, C)
    s = evaluate_surface(model, lm_loss, batches, plane, GridSpec(resolution=3))
    fig = surface_figure(s)
    types = [t.type for t in fig.data]
    assert types == ["surface", "contour", "scatter3d", "scatter"]
    pts3d, pts2d = fig.data[2], fig.data[3]
    assert list(pts2d.text) == ["A", "B", "C"] and list(pts3d.text) == ["A", "B", "C"]
    assert list(pts3d.z) == pytest.approx([s.points[k][2] for k in "ABC"])
    for k, hover in zip("ABC", pts2d.customdata):
        assert f"{s.points[k][2]:.6g}" in hover and k in hover
    assert "loss=%{customdata" in fig.data[0].hovertemplate
    logfig = surface_figure(s, log=True)
    assert logfig.data[0].z[0][0] == pytest.approx(math.log10(s.loss[0, 0]))
    assert list(logfig.data[2].z) == pytest.approx([math.log10(s.points[k][2]) for k in "ABC"])
    prof = surface_profile_figure(s, "x", at=0.0)
    assert prof.data[0].type == "scatter" and len(prof.data[0].x) == 3
    with pytest.raises(SurfaceError):
        surface_profile_figure(s, "z")
    back = Surface.from_dict(json.loads(json.dumps(s.to_dict())))
    np.testing.assert_allclose(back.loss, s.loss)
    assert back.points.keys() == s.points.keys()
    for k in back.points:
        assert back.points[k] == pytest.approx(s.points[k])


def test_bad_input(setup, tmp_path):
    model, A, B, C, batches = setup
    plane = plane_through_points(A, B, C)
    alien = dict(plane.origin)
    alien["not.a.param"] = torch.zeros(3)
    plane_bad = plane_through_points(alien, {**B, "not.a.param": torch.ones(3)}, {**C, "not.a.param": torch.zeros(3)})
    with pytest.raises(SurfaceError, match="does not have"):
        evaluate_surface(model, lm_loss, batches, plane_bad, GridSpec(resolution=2))
    with pytest.raises(SurfaceError, match="no batches"):
        evaluate_surface(model, lm_loss, [], plane, GridSpec(resolution=2))
    with pytest.raises(SurfaceError):
        evaluate_surface(model, lm_loss, batches, plane, "big")
    with pytest.raises(SurfaceError, match="selects none"):
        evaluate_surface(model, lm_loss, batches, plane, 2, params="nothing.*")
    # params restricts the moved tensors: the others keep the model's values
    before = _state(model)
    s = evaluate_surface(model, lm_loss, batches, plane, 2, params="*embed_in*")
    assert s.meta["moved_tensors"] == 1
    assert all(torch.equal(before[k], v) for k, v in _state(model).items())


def test_surface_command_end_to_end(tmp_path):
    """`losslens surface CHECKPOINT --previous PREV --spec ... --grid N --out page.html` on tiny checkpoints."""
    from typer.testing import CliRunner

    from losslens.study.sweep import testing

    from losslens.cli.app import app

    folder = testing.tiny_trajectory(tmp_path / "traj", n=2, hidden=16, layers=1)
    out, js = tmp_path / "surface.html", tmp_path / "surface.json"
    args = [
        "surface",
        str(folder / "step-000200"),
        "--previous",
        str(folder / "step-000100"),
        "--spec",
        "rtn:3:g16",
        "--grid",
        "3",
        "--data",
        str(folder / "data" / "eval.safetensors"),
        "--out",
        str(out),
        "--json",
        str(js),
        "-q",
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    s = Surface.load(js)
    assert s.loss.shape == (3, 3) and set(s.points) == {"A", "B", "C"} and s.plane["kind"] == "points"
    # A's loss on the page equals a direct evaluation of the checkpoint
    from losslens.lm.checkpoints import load_model
    from losslens.lm.core.tokenset import TokenSet

    direct = evaluate(load_model(folder / "step-000200"), TokenSet.load(folder / "data" / "eval.safetensors")).loss
    assert s.points["A"][2] == pytest.approx(direct, rel=1e-6)
    assert out.read_text().count("plotly-graph-div") >= 3
    bad = CliRunner().invoke(
        app,
        args[:1]
        + [
            str(folder / "step-000200"),
            "--previous",
            str(folder / "step-000200"),
            "--grid",
            "3",
            "--data",
            str(folder / "data" / "eval.safetensors"),
            "--out",
            str(out),
            "-q",
        ],
    )
    assert bad.exit_code == 2 and "degenerate plane" in bad.output
    bad = CliRunner().invoke(app, [a if a != "3" else "1" for a in args])
    assert bad.exit_code == 2 and "at least 2" in bad.output
