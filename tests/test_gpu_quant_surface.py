"""GPU: the quantizers and the loss surfaces run the same code on CUDA and agree with the CPU.

Marked ``gpu``: skipped without CUDA (tests/conftest.py). Models are float64 so that CPU and GPU
differ only by the order of floating-point sums (~1e-16 relative), never by precision; quantized
weights may then differ only where a value sits on a rounding tie, which these checks allow for a
tiny fraction of weights and nothing else.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

from losslens.geometry.surfaces.point_planes import plane_through_points
from losslens.geometry.surfaces.random_planes import random_plane
from losslens.geometry.surfaces.surface import evaluate_surface
from losslens.lm.core.next_token_loss import evaluate, lm_loss
from losslens.lm.models.families import FAMILIES, tiny_model
from losslens.lm.quant import quantization_error, quantize

pytestmark = pytest.mark.gpu
DEVICE = "cuda"
VOCAB = 96


def _batches(n=2, b=4, s=16, seed=0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, b, s), generator=torch.Generator().manual_seed(seed))


def _model(family: str, seed: int = 0) -> torch.nn.Module:
    return tiny_model(family, seed=seed, dtype=torch.float64)


def _weights_agree(got: torch.Tensor, want: torch.Tensor, max_tie_fraction: float) -> None:
    """``got`` (any device) equals ``want`` (CPU) to float64 rounding, except on at most
    ``max_tie_fraction`` of the entries (rounding ties decided the other way)."""
    got, want = got.detach().cpu(), want.detach()
    scale = float(want.abs().max()) or 1.0
    off = (got - want).abs() > 1e-9 * scale
    assert float(off.double().mean()) <= max_tie_fraction, (float(off.double().mean()), float((got - want).abs().max()))


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("spec", ["rtn:4:g16", "rtn:3:row", "int8"])
def test_calibration_free_quantizers_on_cuda_equal_cpu(family, spec):
    model = _model(family)
    cpu = quantize(model, spec)
    gpu = quantize(copy.deepcopy(model).to(DEVICE), spec)
    assert gpu.names == cpu.names
    assert all(p.device.type == DEVICE for p in gpu.model.parameters())
    got, want = dict(gpu.model.named_modules()), dict(cpu.model.named_modules())
    for name in cpu.names:
        _weights_agree(got[name].weight, want[name].weight, max_tie_fraction=1e-3)
    for a, b in zip(gpu.report, cpu.report):
        assert a.rel_weight_error == pytest.approx(b.rel_weight_error, rel=1e-6)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("spec", ["gptq:4:g16", "gptq:3:g16:act", "awq:4:g16"])
def test_calibrated_quantizers_on_cuda_equal_cpu(family, spec):
    """GPTQ (sequential driver, Cholesky, error feedback) and AWQ (statistics hooks, scale and clip
    search) on CUDA against the CPU. A flipped tie in GPTQ propagates along its row, hence the
    looser fraction."""
    model = _model(family)
    calib = _batches(seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu = quantize(model, spec, calibration=calib)
        gpu = quantize(copy.deepcopy(model).to(DEVICE), spec, calibration=calib)
    assert gpu.names == cpu.names
    got, want = dict(gpu.model.named_modules()), dict(cpu.model.named_modules())
    for name in cpu.names:
        _weights_agree(got[name].weight, want[name].weight, max_tie_fraction=0.02)
    if spec.startswith("awq"):
        for a, b in zip(gpu.report, cpu.report):
            assert a.objective.alpha == b.objective.alpha, a.name
            assert a.objective.final == pytest.approx(b.objective.final, rel=1e-6)
            assert a.objective.rtn == pytest.approx(b.objective.rtn, rel=1e-9)
    ev = _batches(seed=11)
    assert evaluate(gpu.model, ev).loss == pytest.approx(evaluate(cpu.model, ev).loss, rel=1e-5)


@pytest.mark.parametrize("spec", ["rtn:4:g16", "gptq:4:g16", "awq:4:g16"])
def test_quantization_error_on_cuda_equals_cpu(spec):
    model = _model("llama")
    ev, calib = _batches(seed=11), _batches(seed=5)
    kw = {"calibration": calib} if not spec.startswith("rtn") else {}
    cpu = quantization_error(model, spec, ev, **kw)
    gpu = quantization_error(copy.deepcopy(model).to(DEVICE), spec, ev, **kw)
    assert gpu.fp_loss == pytest.approx(cpu.fp_loss, rel=1e-12)
    assert gpu.q_loss == pytest.approx(cpu.q_loss, rel=1e-5)
    assert gpu.n_tokens == cpu.n_tokens


def _points(model) -> tuple[dict, dict, dict]:
    A = {n: p.detach().clone() for n, p in model.named_parameters()}
    g = torch.Generator().manual_seed(3)
    B = {n: v + 0.05 * torch.randn(v.shape, generator=g, dtype=v.dtype).to(v.device) for n, v in A.items()}
    C = {n: torch.round(v * 8) / 8 for n, v in A.items()}
    return A, B, C


@pytest.mark.parametrize("family", ["gpt_neox", "llama"])
def test_surface_on_cuda_equals_cpu(family):
    """evaluate_surface on a CUDA model (plane built on the CPU, moved by the mover) equals the CPU
    grid and marked points; the vmapped path (points_per_forward) and merged batches too; the
    CUDA model is restored bit for bit."""
    model = _model(family)
    batches = list(_batches(n=2, b=2, s=12, seed=1))
    plane = plane_through_points(*_points(model))
    grid = (np.linspace(-0.5, 1.5, 5), np.linspace(-0.5, 1.5, 4))
    cpu = evaluate_surface(model, lm_loss, batches, plane, grid)
    gpu_model = copy.deepcopy(model).to(DEVICE)
    before = {k: v.clone() for k, v in gpu_model.state_dict().items()}
    for kw in ({}, {"points_per_forward": 3}, {"merge_batches": True}):
        gpu = evaluate_surface(gpu_model, lm_loss, batches, plane, grid, **kw)
        np.testing.assert_allclose(gpu.loss, cpu.loss, rtol=1e-10, atol=0, err_msg=str(kw))
        for label, (x, y, loss) in cpu.points.items():
            assert gpu.points[label][2] == pytest.approx(loss, rel=1e-10), (label, kw)
    assert all(torch.equal(before[k], v) for k, v in gpu_model.state_dict().items())


def test_planes_on_cuda_equal_cpu():
    """plane_through_points and random_plane built from CUDA tensors equal the CPU ones: the same
    coordinates and norms, and the same seeded random directions (drawn on the CPU by design)."""
    model = _model("llama")
    pts = _points(model)
    cpu = plane_through_points(*pts)
    gpu = plane_through_points(*({n: v.to(DEVICE) for n, v in p.items()} for p in pts))
    for label, xy in cpu.coords.items():
        assert gpu.coords[label] == pytest.approx(xy, rel=1e-10, abs=1e-12)
    for n in cpu.names:
        assert gpu.e1[n].device.type == DEVICE
        torch.testing.assert_close(gpu.e1[n].cpu(), cpu.e1[n], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(gpu.e2[n].cpu(), cpu.e2[n], rtol=1e-10, atol=1e-12)
    rc = random_plane(pts[0], seed=4)
    rg = random_plane({n: v.to(DEVICE) for n, v in pts[0].items()}, seed=4)
    for n in rc.names:
        torch.testing.assert_close(rg.e1[n].cpu(), rc.e1[n], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(rg.e2[n].cpu(), rc.e2[n], rtol=1e-10, atol=1e-12)
    assert rg.norms["|e1|"] == pytest.approx(rc.norms["|e1|"], rel=1e-12)
