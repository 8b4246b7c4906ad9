"""The curvature engine on CUDA: the same numbers as on the CPU, within the memory plan.

Marked ``gpu``: skipped without CUDA (tests/conftest.py). ``losslens bench gpu`` runs the larger
validation and records timings.
"""

from __future__ import annotations

import pytest
import torch

from losslens.geometry import HessianOperator, hutchpp_trace, spectral_density, top_eigenvalues
from losslens.lm.core.next_token_loss import lm_loss
from losslens.lm.models.families import tiny_model

pytestmark = pytest.mark.gpu


def _batches(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 96, (2, 16), generator=g) for _ in range(2)]


@pytest.mark.parametrize("family", ["gpt_neox", "olmo2", "llama"])
@pytest.mark.parametrize("kw", [{"vectorize": True}, {"vectorize": False}, {"backend": "forward"}])
def test_cuda_products_equal_cpu_products(family, kw):
    batches = _batches()
    cpu = HessianOperator(tiny_model(family, seed=0, dtype=torch.float64), lm_loss, batches)
    gpu = HessianOperator(tiny_model(family, seed=0, dtype=torch.float64).cuda(), lm_loss, batches, **kw)
    V = torch.randn(4, cpu.dim, dtype=torch.float64)
    a, b = cpu.matmat(V), gpu.matmat(V.cuda()).cpu()
    assert float((a - b).norm() / a.norm()) < 1e-6


def test_cuda_estimators_match_cpu_and_stay_within_their_plan():
    batches = _batches(1)
    cpu = HessianOperator(tiny_model("llama", seed=1, dtype=torch.float64), lm_loss, batches)
    gpu = HessianOperator(tiny_model("llama", seed=1, dtype=torch.float64).cuda(), lm_loss, batches)
    assert hutchpp_trace(gpu, num_matvecs=30, seed=2).value == pytest.approx(
        hutchpp_trace(cpu, num_matvecs=30, seed=2).value, rel=1e-6
    )
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    res = top_eigenvalues(gpu, k=2, max_iter=30, seed=3, max_memory="1GB")
    peak = torch.cuda.max_memory_allocated() - before
    assert peak <= 1.25 * res.memory["predicted_bytes"] + 16 * 2**20
    ref = top_eigenvalues(cpu, k=2, max_iter=30, seed=3)
    assert res.values == pytest.approx(ref.values, rel=1e-6)
    d_gpu = spectral_density(gpu, num_runs=2, num_steps=8, seed=4)
    d_cpu = spectral_density(cpu, num_runs=2, num_steps=8, seed=4)
    assert d_gpu.moment(2) == pytest.approx(d_cpu.moment(2), rel=1e-6)


def test_basis_on_the_host_gives_the_same_eigenvalues():
    gpu = HessianOperator(tiny_model("gpt_neox", seed=2, dtype=torch.float64).cuda(), lm_loss, _batches(2))
    on_device = top_eigenvalues(gpu, k=2, max_iter=40, seed=5)
    on_host = top_eigenvalues(gpu, k=2, max_iter=40, seed=5, basis_device="cpu")
    assert on_host.memory["host_bytes"] > 0 and on_host.memory["settings"]["basis_device"] == "cpu"
    assert on_host.values == pytest.approx(on_device.values, rel=1e-8)


def test_bf16_model_on_cuda_uses_float32_estimator_algebra():
    batches = _batches(3)
    f32 = HessianOperator(tiny_model("olmo2", seed=3, dtype=torch.float32).cuda(), lm_loss, batches)
    b16 = HessianOperator(
        tiny_model("olmo2", seed=3, dtype=torch.bfloat16).cuda(), lm_loss, batches, compute_dtype="bfloat16"
    )
    assert b16.dtype == torch.float32 and b16.param_dtype == torch.bfloat16
    a = top_eigenvalues(f32, k=1, max_iter=40, seed=6).values[0]
    b = top_eigenvalues(b16, k=1, max_iter=40, seed=6).values[0]
    assert abs(b - a) <= 0.1 * abs(a)
