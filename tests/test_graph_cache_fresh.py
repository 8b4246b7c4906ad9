"""Kept gradient graphs must never outlive the weights they were built on (issue #23, item 3).

Every way a user or the project may change a model between two products of one operator with
``ReverseBackend(cache_graphs=True)`` is applied, and the cached operator's product must equal a fresh operator's.
Before the fix the cache keyed on autograd's version counter only, which ``.data`` writes (the
quantizers' way of writing weights) do not move: a product after in-place quantization was
31–76% off.
"""

from __future__ import annotations

import pytest
import torch

from losslens.geometry.operators.fingerprint import CHUNK, content_checksum, model_fingerprint
from losslens.geometry.operators.hessian import HessianOperator
from losslens.geometry.operators.interface import OperatorError
from losslens.geometry.operators.reverse import ReverseBackend
from losslens.lm.core.next_token_loss import lm_loss
from losslens.lm.quant import quantize
from tests.tiny_models import micro_gptneox, random_batches


def _setup(seed: int = 0):
    model = micro_gptneox(seed=seed, dtype=torch.float64)
    batches = random_batches(n_batches=2, seed=seed)
    op = HessianOperator(model, lm_loss, batches, backend=ReverseBackend(cache_graphs=True))
    V = torch.randn(2, op.dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    first = op.matmat(V)
    assert op.num_graph_builds == 2
    op.matmat(V)
    assert op.num_graph_builds == 2  # unchanged weights: the kept graphs are reused
    return model, batches, op, V, first


def _check_fresh(model, batches, op, V, first):
    got = op.matmat(V)
    want = HessianOperator(model, lm_loss, batches).matmat(V)
    assert torch.equal(got, want), float((got - want).norm() / want.norm())
    assert op.num_graph_builds == 4  # rebuilt once for the new weights
    assert not torch.allclose(want, first)  # the change mattered to the Hessian


def _data_copy(model):
    p = model.gpt_neox.layers[0].mlp.dense_h_to_4h.weight
    p.data.copy_(p.data * 1.5)


def _data_mul(model):
    model.gpt_neox.layers[1].attention.dense.weight.data.mul_(0.5)


def _data_assign(model):
    p = model.gpt_neox.layers[0].attention.query_key_value.weight
    p.data = p.data * 0.7


def _no_grad_inplace(model):
    with torch.no_grad():
        model.lm_head.weight.mul_(1.3)


def _load_state_dict(model):
    sd = {k: v * 1.1 for k, v in model.state_dict().items()}
    model.load_state_dict(sd)


def _load_state_dict_assign(model):
    sd = {k: (v * 1.1 if v.is_floating_point() else v) for k, v in model.state_dict().items()}
    model.load_state_dict(sd, assign=True)


def _vector_to_parameters(model):
    v = torch.nn.utils.parameters_to_vector(model.parameters())
    torch.nn.utils.vector_to_parameters(v * 0.9, model.parameters())


def _buffer_data(model):
    buf = model.gpt_neox.rotary_emb.inv_freq
    buf.data.mul_(3.0)


WRITES = [
    _data_copy,
    _data_mul,
    _data_assign,
    _no_grad_inplace,
    _load_state_dict,
    _load_state_dict_assign,
    _vector_to_parameters,
    _buffer_data,
]


@pytest.mark.parametrize("write", WRITES, ids=[w.__name__.strip("_") for w in WRITES])
def test_cached_products_follow_every_kind_of_weight_write(write):
    model, batches, op, V, first = _setup()
    write(model)
    _check_fresh(model, batches, op, V, first)


@pytest.mark.parametrize("spec", ["rtn:2:g-1", "int8", "gptq:2:g-1", "awq:2:g-1"])
def test_cached_products_after_in_place_quantization(spec):
    model, batches, op, V, first = _setup(seed=1)
    names = [n for n, _ in model.named_parameters() if n.endswith("weight") and ".layers." in n and "norm" not in n]
    before = {n: p._version for n, p in model.named_parameters()}
    calib = random_batches(n_batches=2, batch=4, seq=16, seed=7)
    quantize(model, spec, calibration=calib, inplace=True)
    after = {n: p._version for n, p in model.named_parameters()}
    assert names and all(after[n] > before[n] for n in names)  # the writes move the version counter
    _check_fresh(model, batches, op, V, first)


def test_checksum_sees_one_ulp_and_a_permutation_and_nothing_else():
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
        t = torch.randn(3 * CHUNK // 2 + 5, generator=g).to(dtype)  # more than one chunk, ragged end
        base = content_checksum(t)
        assert content_checksum(t.clone()) == base
        u = t.clone()
        u.view(torch.int16)[-1] += 1  # the lowest bits of the last element: one ulp
        assert not torch.equal(u, t) and content_checksum(u) != base
        p = t.clone()
        p[[0, 1]] = p[[1, 0]]
        assert content_checksum(p) != base
        p = t.clone()
        p[[10, CHUNK + 10]] = p[[CHUNK + 10, 10]]  # same position inside two chunks
        assert content_checksum(p) != base
    for t in (torch.zeros(0), torch.tensor([True, False]), torch.arange(5, dtype=torch.int8), torch.arange(7)):
        assert content_checksum(t) == content_checksum(t.clone())
    assert content_checksum(torch.tensor([True, False])) != content_checksum(torch.tensor([False, True]))


def test_fingerprint_is_stable_without_writes_and_sees_data_writes():
    model = micro_gptneox(seed=3, dtype=torch.float32)
    fp = model_fingerprint(model)
    assert model_fingerprint(model) == fp
    p = next(model.parameters())
    old = p.detach().clone()
    p.data[0, 0] += 1.0
    assert p._version == fp[0][2]  # invisible to the version counter ...
    assert model_fingerprint(model) != fp  # ... not to the fingerprint
    p.data.copy_(old)
    assert model_fingerprint(model) == fp  # the same bits again: the kept graphs are valid again


def test_one_configured_backend_keeps_each_operators_graphs_apart():
    """The kept graphs are the reverse backend's per-operator state: one ``ReverseBackend(cache_graphs=True)``
    handed to two operators on different batches gives each its own graphs (each operator keeps a copy),
    so neither reads the other's Hessian; the object handed over keeps nothing itself."""
    model = micro_gptneox(seed=0, dtype=torch.float64)
    shared = ReverseBackend(cache_graphs=True)
    a_batches, b_batches = random_batches(n_batches=2, seed=1), random_batches(n_batches=2, seed=2)
    a = HessianOperator(model, lm_loss, a_batches, backend=shared)
    b = HessianOperator(model, lm_loss, b_batches, backend=shared)
    V = torch.randn(2, a.dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    got_a, got_b = a.matmat(V), b.matmat(V)
    assert a.kept_graphs == 2 and b.kept_graphs == 2 and shared.kept_graphs == 0
    assert torch.equal(got_b, HessianOperator(model, lm_loss, b_batches).matmat(V))
    assert torch.equal(a.matmat(V), got_a) and a.num_graph_builds == 2  # its own graphs, reused
    with pytest.raises(OperatorError, match="vectorize must be True, False or 'auto'"):
        ReverseBackend(vectorize="sometimes")
