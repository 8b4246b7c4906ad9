"""Memory plans of the estimators: what they hold, what they choose under a budget, and refusals
before any work. Dense operators make the state the only memory, so budgets are exact here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from losslens.geometry.operators.dense import DenseOperator
from losslens.geometry.estimators.density import spectral_density
from losslens.geometry.estimators.directional import directional_curvature
from losslens.geometry.estimators.eigen import top_eigenvalues
from losslens.geometry.memory.graphs import peak_new_bytes
from losslens.geometry.operators.hessian import HessianOperator
from losslens.geometry.operators.reverse import ReverseBackend
from losslens.geometry.operators.interface import CurvatureOperator
from losslens.geometry.memory.model import temporaries_bytes, vector_bytes
from losslens.geometry.memory.budget import MemoryBudgetError, format_bytes, parse_bytes
from losslens.geometry.estimators.trace import estimate_memory, hutchinson_trace, hutchpp_trace
from tests.tiny_models import lm_loss, micro_gptneox, random_batches, sym_with_spectrum

EIGS = np.concatenate([[40.0, 25.0, -15.0, 9.0, 6.0], np.linspace(-1, 3, 195)])


def dense(seed=0):
    return DenseOperator(sym_with_spectrum(EIGS, seed=seed))


def vec(op, n=1):
    """A budget of ``n`` full-dim vectors besides the chunk temporaries the plan counts (1 for float64
    vectors, 3 for float32)."""
    return vector_bytes(op.dim, op.dtype, n) + temporaries_bytes(op.dim, op.dtype)


def test_parse_and_format_bytes():
    assert parse_bytes("8GB") == 8_000_000_000 and parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes(10**9) == 1_000_000_000 and parse_bytes(1500) == 1500  # an int is exact bytes (from code)
    for bad in ("eight", "-1GB", 0, "5 parsecs", True, "1.5e3", 1e9, "1500"):  # tests/test_sizes.py: the full table
        with pytest.raises(MemoryBudgetError):
            parse_bytes(bad)
    assert format_bytes(2.5e9) == "2.50 GB"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hutchpp_caps_its_sketch_to_the_budget_and_stays_unbiased(seed):
    H = sym_with_spectrum(EIGS, seed=seed)
    exact = float(torch.trace(H))
    op = DenseOperator(H)
    m = 60
    full = hutchpp_trace(op, num_matvecs=m, seed=seed)
    assert full.memory["settings"]["sketch_size"] == 20 and not full.memory["settings"]["sketch_capped"]
    budget = vec(op, 9)  # room for a sketch of 7 and a block of 1
    capped = hutchpp_trace(DenseOperator(H), num_matvecs=m, seed=seed, max_memory=budget)
    st = capped.memory["settings"]
    assert st["sketch_capped"] and 0 < st["sketch_size"] <= 7
    assert st["sketch_size"] * 2 + st["residual_probes"] == m and capped.num_matvecs == m
    assert capped.memory["predicted_bytes"] <= budget
    assert abs(capped.value - exact) < 4 * capped.stderr + 1e-9
    # the low-rank part still catches the dominant eigenvalues: error well below plain Hutchinson's
    hutch = hutchinson_trace(DenseOperator(H), num_matvecs=m, seed=seed)
    assert capped.stderr < hutch.stderr


def test_hutchpp_with_no_room_for_a_sketch_is_hutchinson_and_says_so():
    op = dense()
    res = hutchpp_trace(op, num_matvecs=30, seed=0, max_memory=vec(op, 2))
    assert res.method == "hutchinson" and res.memory["settings"]["sketch_size"] == 0
    assert res.num_matvecs == 30 and res.num_samples == 30


def test_refusal_before_any_work_states_the_numbers():
    op = dense()
    for call in (
        lambda: hutchpp_trace(op, num_matvecs=30, max_memory=vec(op, 1)),
        lambda: hutchinson_trace(op, num_matvecs=30, max_memory=vec(op, 1)),
        lambda: top_eigenvalues(op, k=2, max_memory=vec(op, 3)),
        lambda: spectral_density(op, num_runs=2, num_steps=10, max_memory=vec(op, 2)),
    ):
        with pytest.raises(MemoryBudgetError, match=r"needs at least .* but max_memory is .*smallest setting"):
            call()
    assert op.num_matvecs == 0
    hop = HessianOperator(micro_gptneox(seed=0), lm_loss, random_batches(n_batches=1))
    with pytest.raises(MemoryBudgetError, match="directional_curvature needs at least"):
        directional_curvature(hop, torch.ones(hop.dim, dtype=hop.dtype), max_memory=vec(hop, 3))
    assert hop.num_matvecs == 0


def test_estimate_memory_matches_what_the_estimator_records():
    op = dense()
    plan = estimate_memory(op, "hutch++", 60, max_memory=vec(op, 12))
    res = hutchpp_trace(op, num_matvecs=60, max_memory=vec(op, 12))
    assert plan.to_dict()["settings"] == res.memory["settings"]
    assert plan.total == res.memory["predicted_bytes"]


@pytest.mark.parametrize("k", [1, 3])
def test_thick_restart_lanczos_matches_eigh_with_a_small_basis(k):
    H = sym_with_spectrum(EIGS, seed=3)
    want = np.sort(np.abs(EIGS))[::-1][:k]
    res = top_eigenvalues(DenseOperator(H), k=k, tol=1e-8, max_iter=200, max_basis=k + 6)
    np.testing.assert_allclose(np.abs(res.values), want, rtol=1e-6)
    assert all(res.converged) and res.memory["restarts"] > 0 and res.memory["settings"]["basis_size"] == k + 6


def test_lanczos_budget_picks_a_smaller_basis_and_still_converges():
    op = dense(seed=4)
    budget = vec(op, 16 + 3 + 2)  # one 16-row basis block, residual, Ritz vector + product
    res = top_eigenvalues(op, k=1, tol=1e-8, max_iter=150, max_memory=budget)
    assert res.memory["settings"]["restarted"] and res.memory["predicted_bytes"] <= budget
    assert res.values[0] == pytest.approx(40.0, rel=1e-7) and res.converged[0]


def test_power_iteration_fits_in_a_few_vectors():
    op = dense(seed=5)
    res = top_eigenvalues(op, k=1, method="power", tol=1e-10, max_iter=500, max_memory=vec(op, 5))
    assert res.values[0] == pytest.approx(40.0, rel=1e-6)


@pytest.mark.parametrize("steps", [5, 20])
def test_slq_without_reorthogonalisation_keeps_low_moments(steps):
    H = sym_with_spectrum(EIGS, seed=6)
    full = spectral_density(DenseOperator(H), num_runs=3, num_steps=steps, seed=2, reorth="full")
    none = spectral_density(DenseOperator(H), num_runs=3, num_steps=steps, seed=2, reorth="none")
    assert none.memory["settings"]["reorth"] == "none" and full.memory["settings"]["reorth"] == "full"
    for p in (0, 1, 2, 3):
        np.testing.assert_allclose(none.run_moments(p), full.run_moments(p), rtol=1e-9)
    assert none.steps == (steps,) * 3 and none.breakdowns == 0


def test_slq_auto_falls_back_to_three_term_recurrence_and_groups_runs():
    op = dense(seed=7)
    res = spectral_density(op, num_runs=4, num_steps=30, seed=0, max_memory=vec(op, 12))
    st = res.memory["settings"]
    assert st["reorth"] == "none" and st["runs_per_group"] <= 4
    roomy = spectral_density(dense(seed=7), num_runs=4, num_steps=30, seed=0, max_memory=vec(op, 40))
    assert roomy.memory["settings"]["reorth"] == "full" and roomy.memory["settings"]["runs_per_group"] == 1
    for p in (1, 2):
        assert res.moment(p) == pytest.approx(roomy.moment(p), rel=1e-8)


def test_hessian_operator_measures_its_graph_and_scales_with_rows():
    model = micro_gptneox(seed=0, dtype=torch.float32)
    b4 = random_batches(batch=4, seq=8, n_batches=1)
    b8 = [torch.cat([b4[0], b4[0]])]
    op4 = HessianOperator(model, lm_loss, b4)
    op8 = HessianOperator(model, lm_loss, b8)
    grads = op4.dim * 4
    g4, g8 = op4.graph_bytes(0) - grads, op8.graph_bytes(0) - grads
    assert g4 > 0 and g8 == 2 * g4
    assert op4.pass_bytes(1, cached=True) == op4.pass_bytes(1, cached=False)  # one batch: same
    two = HessianOperator(model, lm_loss, random_batches(batch=4, seq=8, n_batches=2))
    assert two.pass_bytes(1, cached=True) > two.pass_bytes(1, cached=False)


def test_graph_cache_gives_identical_products_and_follows_weight_changes():
    model = micro_gptneox(seed=1, dtype=torch.float64)
    batches = random_batches(n_batches=3, seed=1)
    plain = HessianOperator(model, lm_loss, batches)
    cached = HessianOperator(model, lm_loss, batches, backend=ReverseBackend(cache_graphs=True))
    V = torch.randn(3, plain.dim, dtype=torch.float64)
    a = plain.matmat(V)
    b1, b2 = cached.matmat(V[:2]), cached.matmat(V[2:])
    assert torch.equal(torch.cat([b1, b2]), a)
    assert cached.num_graph_builds == 3 and plain.num_graph_builds == 3
    with torch.no_grad():  # new weights: the cache must not be used
        next(model.parameters()).mul_(1.1)
    fresh = HessianOperator(model, lm_loss, batches).matmat(V[:1])
    assert torch.equal(cached.matmat(V[:1]), fresh) and cached.num_graph_builds == 6
    cached.release_graphs()
    assert cached.kept_graphs == 0


def test_estimators_use_the_cache_only_inside_their_call():
    model = micro_gptneox(seed=2, dtype=torch.float64)
    op = HessianOperator(model, lm_loss, random_batches(n_batches=2, seed=2))
    res = top_eigenvalues(op, k=1, method="power", max_iter=15, tol=1e-12)
    assert res.memory["settings"]["cache_graphs"] is True
    assert op.num_graph_builds == 2 and op.kept_graphs == 0 and op.cache_graphs is False
    assert res.num_matvecs == res.iterations >= 2


def test_memory_plan_is_recorded_as_plain_data():
    import json

    op = dense()
    for res in (
        hutchpp_trace(op, num_matvecs=30),
        top_eigenvalues(op, k=2),
        spectral_density(op, num_runs=2, num_steps=5),
    ):
        d = json.loads(json.dumps(res.to_dict()))
        assert d["memory"]["predicted_bytes"] > 0 and math.isfinite(d["memory"]["budget_bytes"])


def test_a_bfloat16_basis_halves_the_basis_memory_at_a_stated_accuracy():
    H = sym_with_spectrum(EIGS, seed=8).float()
    exact = float(torch.trace(H))
    full = hutchpp_trace(DenseOperator(H), num_matvecs=60, seed=2)
    half = hutchpp_trace(DenseOperator(H), num_matvecs=60, seed=2, basis_dtype=torch.bfloat16)
    key = next(k for k in half.memory["parts"] if k.startswith("sketch basis"))
    key32 = next(k for k in full.memory["parts"] if k.startswith("sketch basis"))
    assert half.memory["parts"][key] * 2 == full.memory["parts"][key32]
    assert abs(half.value - exact) < 4 * half.stderr + 1e-2 * abs(exact)
    lz = top_eigenvalues(DenseOperator(H), k=2, tol=1e-3, max_iter=100, basis_dtype=torch.bfloat16)
    assert lz.values == pytest.approx([40.0, 25.0], rel=5e-3)
    assert lz.memory["settings"]["basis_dtype"] == "bfloat16"


def test_the_default_budget_is_a_fraction_of_total_memory_and_can_be_shared(monkeypatch):
    from losslens.geometry.memory.budget import CPU_FRACTION, MEMORY_FRACTION_ENV, default_budget, total_bytes

    monkeypatch.delenv(MEMORY_FRACTION_ENV, raising=False)
    total = total_bytes("cpu")
    assert default_budget("cpu") == int(CPU_FRACTION * total)
    monkeypatch.setenv(MEMORY_FRACTION_ENV, "0.05")
    assert default_budget("cpu") == int(0.05 * total)
    for bad in ("lots", "0", "1.5"):
        monkeypatch.setenv(MEMORY_FRACTION_ENV, bad)
        with pytest.raises(MemoryBudgetError, match=MEMORY_FRACTION_ENV):
            default_budget("cpu")


def test_curvature_of_the_last_block_keeps_only_that_part_of_the_graph():
    from losslens.geometry.operators.dense import exact_hessian

    model = micro_gptneox(seed=4, dtype=torch.float64, layers=2)
    batches = random_batches(n_batches=1, seed=4)
    last = ["gpt_neox.layers.1.*", "gpt_neox.final_layer_norm.*"]
    full = HessianOperator(model, lm_loss, batches)
    part = HessianOperator(model, lm_loss, batches, params=last)
    assert part.graph_bytes(0) - part.dim * 8 < 0.7 * (full.graph_bytes(0) - full.dim * 8)
    H, space = exact_hessian(model, lm_loss, batches, params=last)  # the block of H w.r.t. the selection
    V = torch.randn(3, part.dim, dtype=torch.float64)
    assert torch.allclose(part.matmat(V), V @ H, rtol=1e-9, atol=1e-11)
    assert all(p.requires_grad for p in model.parameters())  # flags restored after the calls


class _Diagonal(CurvatureOperator):
    """diag(d): products cost one multiply, so an estimator's own state is all it allocates."""

    def __init__(self, d):
        self.d, self.num_matvecs, self.space = d, 0, None

    dim = property(lambda self: self.d.numel())
    dtype = property(lambda self: self.d.dtype)
    device = property(lambda self: self.d.device)

    def _matmat_flat(self, V):
        return V * self.d


class _RefinedDiagonal(_Diagonal):
    """diag(d) whose "refined" products are its products: an inexact operator's final block, planned."""

    refines = True

    def _refined_matmat_flat(self, V):
        return self._matmat_flat(V)


def test_peak_new_bytes_counts_live_tensors_once_and_ignores_existing_ones():
    x = torch.randn(500, 500)

    def fn():
        a = x @ x  # 1 MB
        view = a.view(-1)  # same storage: not counted again
        b = view.relu()  # 1 MB, a still alive through its view
        del a, view
        c = b * 2  # 1 MB, a freed
        x.add_(0.0)  # in place on an existing tensor: nothing new
        return c.sum()

    out, peak = peak_new_bytes(fn)
    assert 2 * 500 * 500 * 4 <= peak <= 2 * 500 * 500 * 4 + 64 and torch.isfinite(out)  # + the 4-byte sum


@pytest.mark.parametrize(
    "case",
    [
        "power",
        "power k=3",
        "power k=4 refined",
        "lanczos",
        "lanczos k=3 refined",
        "lanczos restarted",
        "slq full",
        "slq none",
        "hutch++",
        "hutchinson",
    ],
)
def test_estimators_allocate_what_their_plan_says(case):
    """Every tensor the estimator allocates, tracked op by op, against its recorded plan."""
    d = torch.rand(3_000_000, generator=torch.Generator().manual_seed(0))  # vectors 12 MB, chunks 16.8 MB
    d[:3] = torch.tensor([50.0, 30.0, 20.0])
    op, refined = _Diagonal(d), _RefinedDiagonal(d)
    runs = {
        "power": lambda: top_eigenvalues(op, k=1, method="power", max_iter=8, tol=1e-12),
        "power k=3": lambda: top_eigenvalues(op, k=3, method="power", max_iter=8, tol=1e-12),
        "power k=4 refined": lambda: top_eigenvalues(refined, k=4, method="power", max_iter=8, tol=1e-12),
        "lanczos": lambda: top_eigenvalues(op, k=1, method="lanczos", max_iter=12, tol=1e-12),
        "lanczos k=3 refined": lambda: top_eigenvalues(refined, k=3, method="lanczos", max_iter=12, tol=1e-12),
        "lanczos restarted": lambda: top_eigenvalues(
            op, k=1, method="lanczos", max_iter=30, tol=1e-12, max_memory=vec(op, 10)
        ),
        "slq full": lambda: spectral_density(op, num_runs=2, num_steps=6, reorth="full"),
        "slq none": lambda: spectral_density(op, num_runs=2, num_steps=6, reorth="none"),
        "hutch++": lambda: hutchpp_trace(op, num_matvecs=15),
        "hutchinson": lambda: hutchinson_trace(op, num_matvecs=4),
    }
    res, peak = peak_new_bytes(runs[case])
    predicted = res.memory["predicted_bytes"]
    assert 0.75 * predicted <= peak <= predicted + 4096, (case, peak, predicted, res.memory["parts"])


@pytest.mark.parametrize("case", ["lanczos", "lanczos restarted", "slq full", "slq none"])
def test_lanczos_and_slq_state_is_exactly_the_plan_at_10m_dimensions(case):
    """At 10M dimensions a vector (40 MB) outweighs the chunk temporaries (16.8 MB each), so one
    vector kept alive past its use shows: measured ≤ plan ≤ measured / 0.99."""
    d = torch.rand(10_000_000, generator=torch.Generator().manual_seed(1))
    d[:3] = torch.tensor([50.0, 30.0, 20.0])
    op = _Diagonal(d)
    runs = {
        "lanczos": lambda: top_eigenvalues(op, k=1, max_iter=4, tol=1e-12),
        "lanczos restarted": lambda: top_eigenvalues(op, k=1, max_iter=6, tol=1e-12, max_basis=3),
        "slq full": lambda: spectral_density(op, num_runs=2, num_steps=3, reorth="full"),
        "slq none": lambda: spectral_density(op, num_runs=2, num_steps=3, reorth="none"),
    }
    res, peak = peak_new_bytes(runs[case])
    predicted = res.memory["predicted_bytes"]
    assert peak <= predicted + 4096 and predicted <= peak / 0.99, (case, peak, predicted, res.memory["parts"])
    if case == "lanczos restarted":
        assert res.memory["restarts"] > 0


class _PlanOnly(CurvatureOperator):
    """A reverse-backend operator of 10M float32 dimensions for plans only (no products): one
    graph rebuilt per step costs 300 MB, the graphs of all batches kept 700 MB."""

    chunk_size, max_memory, num_matvecs, space = None, None, 0, None
    product_backend = ReverseBackend(vectorize=False)
    dim = 10_000_000
    dtype = torch.float32
    device = torch.device("cpu")

    def pass_bytes(self, k, cached=None, chunk=None):
        return (700 if cached else 300) * 10**6 + k * 40 * 10**6

    def _matmat_flat(self, V):
        raise AssertionError("a plan-only operator")


def test_lanczos_planner_gives_convergence_its_basis_before_the_graph_cache():
    """Below max(16, 4k) vectors a larger basis comes before keeping the graphs; from there on the
    graphs are kept; a basis below k + 4 is refused (power iteration is the advice)."""
    from losslens.geometry.estimators.eigen import ENOUGH_BASIS, SMALLEST_EXTRA
    from losslens.geometry.estimators.eigen import estimate_memory as eigen_memory

    op = _PlanOnly()
    one, cache_extra = vector_bytes(op.dim, op.dtype), 400 * 10**6  # the cache costs 10 basis vectors

    def total(m, cache):
        kept = eigen_memory(op, 1, "lanczos", 100, 10**15, max_basis=m)  # graphs kept when it fits
        assert kept.settings["cache_graphs"] and kept.settings["basis_size"] == m
        return kept.total - (0 if cache else cache_extra)

    assert total(7, True) - total(6, True) == one
    plan = eigen_memory(op, 1, "lanczos", 100, total(6, True))  # basis 6 + cache, or 16 without
    assert plan.settings["basis_size"] == 16 and plan.settings["cache_graphs"] is False
    plan = eigen_memory(op, 1, "lanczos", 100, total(ENOUGH_BASIS, True))
    assert plan.settings["basis_size"] == ENOUGH_BASIS and plan.settings["cache_graphs"] is True
    plan = eigen_memory(op, 1, "lanczos", 100, total(ENOUGH_BASIS + 10, False))  # 26 without, 16 with: cache
    assert plan.settings["basis_size"] == ENOUGH_BASIS and plan.settings["cache_graphs"] is True
    with pytest.raises(MemoryBudgetError, match="method='power'"):
        eigen_memory(op, 1, "lanczos", 100, total(1 + SMALLEST_EXTRA, False) - 1)
    assert eigen_memory(op, 1, "lanczos", 100, total(1 + SMALLEST_EXTRA, False)).settings["basis_size"] == 5


def test_chunk_temporaries_are_at_most_51_MB():
    """README: the float64 chunk temporaries of the reductions take ≤ 51 MB whatever the dimension
    (every estimator plans them for its vectors' dtype: 3 chunks of CHUNK float64 numbers for float32
    vectors, 1 for float64 ones)."""
    import re
    from pathlib import Path

    from losslens.geometry.memory.model import chunk_temporaries, temporaries_bytes

    calls = [
        c
        for f in Path("geometry/estimators").glob("*.py")
        for c in re.findall(r"temporaries_bytes\(([^)]*)\)", f.read_text())
    ]
    assert calls and set(calls) == {"op.dim, op.dtype"}, calls  # every plan counts them for its vectors' dtype
    counts = {chunk_temporaries(dt) for dt in (torch.float64, torch.float32, torch.bfloat16, None)}
    assert counts == {1, 3}
    assert temporaries_bytes(10**12, torch.float32) <= 51e6 < temporaries_bytes(10**12, count=4)
    assert temporaries_bytes(10**12, torch.float64) <= 17e6


@pytest.mark.parametrize("case", ["power", "power k=3", "lanczos", "slq full", "slq none", "hutch++", "hutchinson"])
def test_float64_vectors_plan_one_chunk_and_allocate_what_the_plan_says(case):
    """Float64 vectors: the reductions cast nothing, so the plan counts one float64 chunk, and every
    tensor the estimator allocates stays within 0.95–1 of it (the plan's parts: vectors, one chunk)."""
    d = torch.rand(3_000_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    d[:3] = torch.tensor([50.0, 30.0, 20.0], dtype=torch.float64)
    op = _Diagonal(d)
    runs = {
        "power": lambda: top_eigenvalues(op, k=1, method="power", max_iter=8, tol=1e-12),
        "power k=3": lambda: top_eigenvalues(op, k=3, method="power", max_iter=8, tol=1e-12),
        "lanczos": lambda: top_eigenvalues(op, k=1, method="lanczos", max_iter=12, tol=1e-300),
        "slq full": lambda: spectral_density(op, num_runs=2, num_steps=6, reorth="full"),
        "slq none": lambda: spectral_density(op, num_runs=2, num_steps=6, reorth="none"),
        "hutch++": lambda: hutchpp_trace(op, num_matvecs=15),
        "hutchinson": lambda: hutchinson_trace(op, num_matvecs=4),
    }
    res, peak = peak_new_bytes(runs[case])
    predicted = res.memory["predicted_bytes"]
    from losslens.geometry.memory.model import TEMPORARIES_PART

    assert res.memory["parts"][TEMPORARIES_PART] == 8 * (1 << 21)
    assert 0.95 * predicted <= peak <= predicted + 4096, (case, peak, predicted, res.memory["parts"])
