"""A run's landscape (losslens.study.landscape) on real tiny trajectories: grid values against direct loss
evaluation at marked points, checkpoints on their own plane where their loss is, quantized points
projected with their residuals, and the figure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from losslens.lm.checkpoints import CheckpointLoader, Trajectory
from losslens.lm.core.next_token_loss import evaluate
from losslens.lm.data import default_token_sets
from losslens.study.landscape.trajectory_landscape import residual_flags, trajectory_landscape
from losslens.lm.quant.dispatch import quantize
from tests.fixtures_trajectory import tiny_trajectory_dir


@pytest.fixture(scope="module")
def runs():
    a = Trajectory.from_folder(tiny_trajectory_dir(), name="wsd")
    b = Trajectory.from_folder(tiny_trajectory_dir(seed=1), name="wsd-seed1")
    ev = list(default_token_sets(a, shapes={"eval": (2, 4, 32)})["eval"])
    return a, b, ev


def _set_weights(model, point):
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in point:
                p.copy_(point[n])


def test_three_checkpoints_sit_on_the_grid_where_their_own_loss_is(runs):
    a, _, ev = runs
    land = trajectory_landscape(a, ev, grid=5)
    assert len(land.pca.labels) == 3
    np.testing.assert_allclose(land.pca.residuals(), 0, atol=1e-5 * land.pca.distances.max())
    for lab in land.pca.labels:  # the plane point of each checkpoint is the checkpoint (float32 storage)
        assert land.surface.points[lab][2] == pytest.approx(land.own_loss[lab], rel=1e-5)
    # JSON: explained variance, coordinates and residuals of every point
    d = land.describe()
    assert sum(d["pca"]["explained_variance_ratio"]) == pytest.approx(1.0, abs=1e-9)
    assert [c["label"] for c in d["pca"]["checkpoints"]] == a.labels


def test_grid_values_equal_direct_evaluation_and_quantized_points_are_projected(runs):
    a, b, ev = runs
    first = trajectory_landscape([a, b], None, grid=None, k=3)
    xy = first.pca.plane_coords()
    x_axis = np.array(sorted({float(xy[0, 0]), float(xy[4, 0]), 0.0}))
    y_axis = np.array(sorted({float(xy[0, 1]), float(xy[4, 1]), 0.0}))
    land = trajectory_landscape([a, b], ev, spec="rtn:2:g32", grid=(x_axis, y_axis), k=3)
    np.testing.assert_array_equal(land.pca.coords, first.pca.coords)  # deterministic
    model = CheckpointLoader(a).load(a[-1])
    plane = land.pca.plane()
    for i, j in [(0, 0), (1, 2), (2, 1)]:
        _set_weights(model, plane.point(x_axis[i], y_axis[j]))
        direct = evaluate(model, ev).loss
        assert land.surface.loss[j, i] == pytest.approx(direct, rel=1e-6)
    # every quantized point: its coordinates are (θ̂ − c)·e_j of the actual quantized weights
    ref = b[1]
    qm = quantize(CheckpointLoader(b).load(ref), "rtn:2:g32")
    q = {n: p.detach().double() for n, p in qm.model.named_parameters()}
    p = land.quantized[f"wsd-seed1/{ref.label}"]
    d = torch.cat([(q[n] - land.pca.center[n].double()).reshape(-1) for n in land.pca.center])
    for j in range(3):
        e = torch.cat([land.pca.directions[j][n].double().reshape(-1) for n in land.pca.center])
        assert float(p.coords[j]) == pytest.approx(float(d @ e), rel=1e-6, abs=1e-9)
    assert 0 <= p.relative_residual <= 1
    assert land.own_loss[p.label] == pytest.approx(evaluate(qm.model, ev).loss, rel=1e-9)
    flags = residual_flags(land, threshold=0.0)
    assert flags[p.label] is (p.relative_residual > 0)


def test_landscape_figure_draws_every_run_and_the_quantized_points(runs):
    from losslens.study.report.landscape_figures import landscape_figure

    a, b, ev = runs
    land = trajectory_landscape([a, b], ev, spec="rtn:2:g32", grid=4)
    fig = landscape_figure(land)
    names = [t.name for t in fig.data]
    assert "wsd" in names and "wsd-seed1" in names and "quantized (rtn:2:g32)" in names
    quant = next(t for t in fig.data if t.name == "quantized (rtn:2:g32)")
    assert len(quant.x) == 6 and all("off the plane" in c for c in quant.customdata)
    with pytest.raises(ValueError, match="no surface"):
        landscape_figure(trajectory_landscape(a, None, grid=None))


def test_checkpoint_source_reads_slices_equal_to_safetensors_and_torch_files(tmp_path, runs):
    from safetensors.torch import load_file, save_file

    from losslens.lm.checkpoints import CheckpointRef
    from losslens.study.landscape.sources import checkpoint_source

    a, _, _ = runs
    model = CheckpointLoader(a).load(a[0])
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    for dtype in (torch.float32, torch.bfloat16):
        folder = tmp_path / str(dtype)
        folder.mkdir()
        (folder / "config.json").write_text((Path(a.meta["folder"]) / a[0].label / "config.json").read_text())
        save_file({n: t.to(dtype).contiguous() for n, t in state.items()}, str(folder / "model.safetensors"))
        src = checkpoint_source(CheckpointRef.from_path(folder), model)
        ref = load_file(str(folder / "model.safetensors"))
        for n, t in ref.items():
            rows = t.reshape(t.shape[0], -1) if t.ndim else t.reshape(1, 1)
            assert src.dtype(n) == dtype and src.held_bytes == 0
            torch.testing.assert_close(src.rows(n, 1, min(3, rows.shape[0])), rows[1:3], rtol=0, atol=0)
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "config.json").write_text((Path(a.meta["folder"]) / a[0].label / "config.json").read_text())
    torch.save(state, folder / "pytorch_model.bin")
    src = checkpoint_source(CheckpointRef.from_path(folder), model)
    assert src.held_bytes == (folder / "pytorch_model.bin").stat().st_size
    n = next(iter(state))
    torch.testing.assert_close(src.rows(n, 0, 2), state[n].reshape(state[n].shape[0], -1)[:2], rtol=0, atol=0)
