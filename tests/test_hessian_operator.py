"""HessianOperator against oracles: exact row-by-row Hessians (losslens.geometry.operators.dense.exact_hessian) and
PyHessian, on a tiny MLP, a micro GPT-NeoX (LayerNorm) and a micro Llama (RMSNorm/SiLU), float64."""

from __future__ import annotations

import pytest
import torch

from losslens.geometry.operators.attention import second_order_attention
from losslens.geometry.operators.dense import DenseOperator, exact_hessian
from losslens.geometry.operators.hessian import HessianOperator
from losslens.geometry.operators.reverse import ReverseBackend
from tests.tiny_models import (
    lm_loss,
    micro_gptneox,
    micro_llama,
    mlp_batches,
    mlp_loss,
    random_batches,
    tiny_mlp,
)

EXACT = 1e-8  # relative tolerance against the exact Hessian (float64)
CONFIGS = [
    dict(backend=ReverseBackend(vectorize=True)),
    dict(backend=ReverseBackend(vectorize=False)),
    dict(backend="forward"),
    dict(backend=ReverseBackend(vectorize=True), chunk_size=2),
    dict(backend="forward", chunk_size=2),
]
CFG_IDS = ["rev-vec", "rev-seq", "fwd", "rev-vec-chunk2", "fwd-chunk2"]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


class Problem:
    """A model, its loss, batches with unequal sizes, and the exact Hessian of the size-weighted mean."""

    def __init__(self, name: str):
        self.name = name
        if name == "mlp":
            self.model, self.loss = tiny_mlp(0), mlp_loss
            self.batches = mlp_batches(sizes=[8, 3], seed=1)
            self.sizes = [8, 3]
        else:
            self.model = micro_gptneox(0, layers=1) if name == "neox" else micro_llama(0, layers=1)
            self.loss = lm_loss
            self.sizes = [3, 2]
            self.batches = random_batches(sizes=self.sizes, seq=6, seed=1)
        per_batch = [exact_hessian(self.model, self.loss, [b]) for b in self.batches]
        self.space = per_batch[0][1]
        self.Hs = [H for H, _ in per_batch]  # H of the weighted mean = Σ w_b H_b (linearity)
        self.H = self.weighted(self.sizes)

    def weighted(self, w) -> torch.Tensor:
        return sum(wi * H for wi, H in zip(w, self.Hs)) / sum(w)


@pytest.fixture(scope="module", params=["mlp", "neox", "llama"])
def problem(request) -> Problem:
    return Problem(request.param)


def random_block(space, k: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(k, space.dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_matmat_flat_matches_exact_hessian(problem: Problem, cfg: dict):
    op = HessianOperator(problem.model, problem.loss, problem.batches, **cfg)  # default weights = batch sizes
    V = random_block(op.space, 5)
    out = op.matmat(V)
    assert out.shape == V.shape and out.dtype == torch.float64
    assert rel(out, V @ problem.H) < EXACT
    assert op.num_matvecs == 5


@pytest.mark.parametrize("cfg", CONFIGS[:3], ids=CFG_IDS[:3])
def test_matvec_and_dicts_match_exact_hessian(problem: Problem, cfg: dict):
    op = HessianOperator(problem.model, problem.loss, problem.batches, **cfg)
    v = random_block(op.space, 1, seed=3)[0]
    hv = op.matvec(v)
    assert hv.shape == (op.dim,) and rel(hv, problem.H @ v) < EXACT
    hv_dict = op.matvec(op.space.unflatten(v))
    assert set(hv_dict) == set(op.space.names)
    assert rel(op.space.flatten(hv_dict), problem.H @ v) < EXACT
    V = random_block(op.space, 3, seed=4)
    out = op.matmat(op.space.unflatten(V))
    assert all(out[n].shape == (3, *s) for n, s in zip(op.space.names, op.space.shapes))
    assert rel(op.space.flatten(out, batched=True), V @ problem.H) < EXACT


def test_explicit_weights_and_single_batch(problem: Problem):
    w = [0.2, 3.0, 1.0][: len(problem.batches)]
    op = HessianOperator(problem.model, problem.loss, problem.batches, weights=w)
    V = random_block(op.space, 2, seed=5)
    assert rel(op.matmat(V), V @ problem.weighted(w)) < EXACT
    assert rel(HessianOperator(problem.model, problem.loss, problem.batches[:1]).matmat(V), V @ problem.Hs[0]) < EXACT


def test_param_glob_subset_is_principal_submatrix(problem: Problem):
    glob = {
        "mlp": ["1.*", "5.weight"],
        "neox": ["*layers.0.attention.*", "*final_layer_norm*"],
        "llama": ["*norm*", "*mlp.down_proj*"],
    }[problem.name]
    for backend in ("reverse", "forward"):
        op = HessianOperator(problem.model, problem.loss, problem.batches, params=glob, backend=backend)
        assert 0 < op.dim < problem.space.dim
        idx = torch.cat([torch.arange(problem.space.dim)[problem.space.slices[n]] for n in op.space.names])
        Hsub = problem.H[idx][:, idx]
        V = random_block(op.space, 3, seed=6)
        assert rel(op.matmat(V), V @ Hsub) < EXACT


def test_to_scipy_matches_dense(problem: Problem):
    import numpy as np

    op = HessianOperator(problem.model, problem.loss, problem.batches)
    lin = op.to_scipy()
    X = np.random.default_rng(0).standard_normal((op.dim, 3))
    ref = problem.H.numpy() @ X
    assert np.linalg.norm(lin @ X - ref) / np.linalg.norm(ref) < EXACT
    assert np.linalg.norm(lin.matvec(X[:, 0]) - ref[:, 0]) / np.linalg.norm(ref[:, 0]) < EXACT
    dense = DenseOperator(problem.H, problem.space)
    V = random_block(op.space, 2, seed=7)
    assert rel(op.matmat_flat(V), dense.matmat_flat(V)) < EXACT


def test_gradient_matches_autograd(problem: Problem):
    op = HessianOperator(problem.model, problem.loss, problem.batches)
    loss, g = op.gradient()
    w = torch.tensor(problem.sizes, dtype=torch.float64)
    w = w / w.sum()
    params = list(op.space.names)
    named = dict(problem.model.named_parameters())
    ref_loss, ref = 0.0, torch.zeros(op.dim, dtype=torch.float64)
    with second_order_attention():
        for wi, b in zip(w.tolist(), problem.batches):
            L = problem.loss(problem.model, b)
            gs = torch.autograd.grad(L, [named[n] for n in params])
            ref += wi * torch.cat([x.reshape(-1) for x in gs])
            ref_loss += wi * float(L)
    assert abs(loss - ref_loss) < 1e-12 and rel(g, ref) < 1e-12


# ---------------------------------------------------------------- PyHessian, the peer oracle
class _Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, ids):
        return self.m(input_ids=ids).logits


def _shifted_ce(logits, ids):
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


@pytest.mark.parametrize("factory", [micro_gptneox, micro_llama], ids=["neox", "llama"])
def test_pyhessian_identical_hvps(factory):
    from pyhessian import hessian
    from pyhessian.utils import hessian_vector_product

    model = factory(1)
    batches = random_batches(sizes=[3, 3], seq=7, seed=2)
    op = HessianOperator(model, lm_loss, batches)
    V = random_block(op.space, 2, seed=8)
    ours = op.matmat(V)
    ours_one = HessianOperator(model, lm_loss, batches[:1]).matmat(V)
    wrapped = _Logits(model)
    try:
        with second_order_attention():
            H1 = hessian(wrapped, _shifted_ce, data=(batches[0], batches[0]), cuda=False)
            one = torch.stack(
                [
                    torch.cat(
                        [
                            h.reshape(-1)
                            for h in hessian_vector_product(H1.gradsH, H1.params, list(op.space.unflatten(v).values()))
                        ]
                    )
                    for v in V
                ]
            )
            Hd = hessian(wrapped, _shifted_ce, dataloader=[(b, b) for b in batches], cuda=False)
            many = torch.stack(
                [
                    torch.cat(
                        [h.reshape(-1) for h in Hd.dataloader_hv_product(list(op.space.unflatten(v).values()))[1]]
                    )
                    for v in V
                ]
            )
    finally:
        model.zero_grad(set_to_none=True)
    assert rel(ours_one, one.detach()) < 1e-10
    assert rel(ours, many.detach()) < 1e-10


def test_pyhessian_mlp():
    from pyhessian import hessian
    from pyhessian.utils import hessian_vector_product

    model = tiny_mlp(2)
    ((x, y),) = mlp_batches(1, 16, seed=3)
    op = HessianOperator(model, mlp_loss, [(x, y)])
    v = random_block(op.space, 1, seed=9)[0]
    H = hessian(model, torch.nn.functional.cross_entropy, data=(x, y), cuda=False)
    ref = torch.cat(
        [h.reshape(-1) for h in hessian_vector_product(H.gradsH, H.params, list(op.space.unflatten(v).values()))]
    )
    model.zero_grad(set_to_none=True)
    assert rel(op.matvec(v), ref.detach()) < 1e-10
