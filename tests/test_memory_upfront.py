"""Budget checks before any work (issue #22, item 4): a surface plans its forwards before the
first grid point, and the explain probe plans its curvature steps before any quantizer runs."""

from __future__ import annotations

import pytest
import torch

from losslens.geometry.memory.budget import MemoryBudgetError
from losslens.geometry.surfaces.moving import estimate_memory, forward_bytes, planned_forward_bytes
from losslens.geometry.surfaces.random_planes import random_plane
from losslens.geometry.surfaces.surface import evaluate_surface
from losslens.lm.core.next_token_loss import lm_loss
from tests.tiny_models import micro_gptneox, micro_llama, random_batches


@pytest.mark.parametrize("family", [micro_gptneox, micro_llama])
@pytest.mark.parametrize("rows", [3, 6, 12])
def test_the_planned_forward_matches_the_measured_one(family, rows):
    """1- and 2-row forwards, extrapolated, give the peak of the whole batch's forward."""
    model = family(seed=0, dtype=torch.float32)
    batch = random_batches(n_batches=1, batch=rows, seq=16, seed=rows)[0]
    measured = forward_bytes(model, lm_loss, batch)
    planned = planned_forward_bytes(model, lm_loss, [batch[:1], batch])
    assert 0.95 * measured <= planned <= 1.05 * measured, (planned, measured)
    assert planned_forward_bytes(model, lm_loss, [batch], points_per_forward=3) == 3 * planned


def test_a_surface_is_refused_before_the_model_moves_or_any_grid_point_runs():
    model = micro_gptneox(seed=0, dtype=torch.float32)
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    batches = random_batches(n_batches=2, batch=6, seq=16, seed=0)
    plane = random_plane(original, seed=0)
    copies = estimate_memory(model, plane, max_memory="1GB").total
    budget = copies + forward_bytes(model, lm_loss, batches[0]) // 2  # the copies fit, a forward does not
    calls = []

    def watched(m, batch):
        calls.append((batch.shape[0], all(torch.equal(p, original[n]) for n, p in m.named_parameters())))
        return lm_loss(m, batch)

    with pytest.raises(MemoryBudgetError, match="forwards of one evaluation"):
        evaluate_surface(model, watched, batches, plane, grid=3, max_memory=budget)
    assert calls and all(rows <= 2 and unmoved for rows, unmoved in calls), calls  # planning forwards only
    surf = evaluate_surface(
        model, watched, batches, plane, grid=3, max_memory=copies + 4 * forward_bytes(model, lm_loss, batches[0])
    )
    assert surf.loss.shape == (3, 3)


def test_explain_refuses_before_the_quantizer_runs(monkeypatch):
    import losslens.measure.explain.direction as measure
    from losslens.measure.explain import explain_specs

    model = micro_llama(seed=0, dtype=torch.float32)
    curvature = random_batches(n_batches=2, batch=2, seq=8, seed=1)
    calibration = random_batches(n_batches=2, batch=4, seq=8, seed=2)
    ran = []
    real = measure.quantize
    monkeypatch.setattr(measure, "quantize", lambda *a, **k: ran.append(a[1]) or real(*a, **k))
    with pytest.raises(MemoryBudgetError, match="(directional_curvature|the curvature operator) needs at least"):
        explain_specs(model, ["gptq:3:row"], curvature, calibration=calibration, max_memory=1000)
    assert ran == []  # no GPTQ before the refusal
    plans = measure.plan_curvature(model, curvature, within=("layer",), trace=("hutch++", 30), max_memory="1GB")
    assert set(plans) == {"direction", "within layer", "trace"}
    out = explain_specs(model, ["gptq:3:row"], curvature, calibration=calibration, max_memory="1GB", trace_matvecs=6)
    assert ran == ["gptq:3:row"] and out[0].spec.startswith("gptq")
