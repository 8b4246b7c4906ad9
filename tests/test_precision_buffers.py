"""Issue #47 item 4: float32 compute covers the rotary tables, not only the parameters.

A tiny Llama cast to bfloat16 holds ``inv_freq`` rounded to bfloat16; at positions up to 256 that
rounding moves the attention phases by up to 0.5 rad. The products with default (float32) compute
must match the float64 Hessian of the same bfloat16 weights whose every table is float64 (the oracle:
a float64 copy, ``inv_freq`` from its definition in float64, HF's float32 islands kept in float64,
double backward written here), and the stored buffers come back bit for bit.

Measured (initializer_range 0.2, sequence 256, 2 layers): reverse 2.1e-6, difference 2.8e-4 off the
oracle; the oracle with the bfloat16-rounded table is 1.7e-2 off it, and so are the products without
the recomputed tables."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from losslens.geometry import HessianOperator
from losslens.geometry.operators import precision
from losslens.geometry.operators.rotary import _layer_type, rotary_tables
from losslens.lm.core.next_token_loss import lm_loss
from losslens.lm.models.fidelity import float64_fidelity

transformers = pytest.importorskip("transformers")

SEQ = 256


def _model() -> torch.nn.Module:
    # initializer_range 0.2: attention logits large enough that positions matter (at 0.02 a random
    # model's attention is near uniform and rotary phases barely move the Hessian)
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
        initializer_range=0.2,
        use_cache=False,
        attn_implementation="eager",
    )
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


def _definition(model, dtype=torch.float64) -> torch.Tensor:
    """``1 / θ^(2i/d)``, i = 0 … d/2 − 1: the default RoPE inverse frequencies, written out here."""
    rope = model.model.rotary_emb
    dim = 2 * rope.inv_freq.numel()
    theta = model.config.rope_parameters["rope_theta"]
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)).to(dtype)


def _oracle(model, batch, V, exact_tables: bool) -> torch.Tensor:
    """H V of the float64 copy, by double backward; ``exact_tables``: inv_freq from its definition in
    float64, else the bfloat16-rounded table upcast (what a parameters-only policy computes)."""
    m64 = copy.deepcopy(model).double()
    if exact_tables:
        rope = m64.model.rotary_emb
        rope.inv_freq.data = _definition(model)
        rope.original_inv_freq.data = _definition(model)
    params = list(m64.parameters())
    out = []
    with float64_fidelity():
        grads = torch.autograd.grad(lm_loss(m64, batch), params, create_graph=True)
        flat = torch.cat([g.reshape(-1) for g in grads])
        for v in V:
            hv = torch.autograd.grad((flat * v).sum(), params, retain_graph=True)
            out.append(torch.cat([h.reshape(-1) for h in hv]))
    return torch.stack(out)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture(scope="module")
def case():
    model = _model()
    batch = torch.randint(0, 64, (1, SEQ), generator=torch.Generator().manual_seed(1))
    n = sum(p.numel() for p in model.parameters())
    V = torch.randn(2, n, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    return model, batch, V, _oracle(model, batch, V, exact_tables=True)


def test_the_bfloat16_table_is_not_the_definition_and_is_recomputed():
    model = _model()
    rope = model.model.rotary_emb
    assert rope.inv_freq.dtype == torch.bfloat16
    exact = _definition(model, torch.float32)
    assert not torch.equal(rope.inv_freq.float(), exact)  # the mechanism: bf16 rounding of the frequencies
    tables = rotary_tables(model, torch.float32)
    assert set(tables) == {id(rope.inv_freq), id(rope.original_inv_freq)}
    assert all(t.dtype == torch.float32 and torch.equal(t, exact) for t in tables.values())
    wide = rotary_tables(model, torch.float64)
    assert torch.allclose(wide[id(rope.inv_freq)], _definition(model), rtol=1e-15, atol=0)
    assert wide[id(rope.inv_freq)].dtype == torch.float64  # the definition evaluated in float64
    assert rotary_tables(model, torch.bfloat16) == {}  # half compute keeps the stored tables
    assert rotary_tables(copy.deepcopy(model).float(), torch.float32)  # a bf16 round trip is still repaired
    assert rotary_tables(_model().float().to(torch.float32), torch.float32)


def test_default_products_of_a_bfloat16_llama_at_long_positions_match_the_all_float64_hessian(case):
    model, batch, V, ref = case
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    stale = _oracle(model, batch, V, exact_tables=False)
    assert _rel(stale, ref) > 1e-2  # the bf16-rounded table changes the Hessian by percents
    reverse = HessianOperator(model, lm_loss, [batch])
    difference = HessianOperator(model, lm_loss, [batch], backend="difference")
    assert reverse.param_dtype == torch.float32
    assert _rel(reverse.matmat_flat(V.float()), ref) <= 1e-5
    assert _rel(difference.matmat_flat(V.float()), ref) <= 1e-3
    for n, b in model.named_buffers():  # the stored tables: bit for bit, still bfloat16
        assert b.dtype == buffers[n].dtype == torch.bfloat16 and torch.equal(b, buffers[n]), n
    for n, p in model.named_parameters():
        assert p.dtype == torch.bfloat16 and torch.equal(p.detach(), weights[n]), n


def test_without_the_recomputed_tables_the_products_are_off(case, monkeypatch):
    model, batch, V, ref = case
    monkeypatch.setattr(precision, "rotary_tables", lambda model, dtype: {})
    got = HessianOperator(model, lm_loss, [batch]).matmat_flat(V.float())
    assert _rel(got, ref) > 1e-2


def test_the_float64_reference_is_built_the_same_way(case):
    """A float64 operator on a plain ``.double()`` copy (how references are made) swaps in the
    float64 definition too, so it is the all-float64 oracle, not the bf16-table one."""
    model, batch, V, ref = case
    with float64_fidelity():
        got = HessianOperator(copy.deepcopy(model).double(), lm_loss, [batch]).matmat_flat(V)
    assert _rel(got, ref) <= 1e-10


def test_layer_typed_tables_are_found():
    assert _layer_type("inv_freq") is None and _layer_type("original_inv_freq") is None
    assert _layer_type("sliding_attention_inv_freq") == "sliding_attention"
    assert _layer_type("full_attention_original_inv_freq") == "full_attention"
    cfg = transformers.Gemma3TextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=64,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.Gemma3ForCausalLM(cfg).to(torch.bfloat16)
    names = {id(b): n for n, b in model.named_buffers() if n.endswith("inv_freq") and b.dtype == torch.bfloat16}
    tables = rotary_tables(model, torch.float32)
    assert names and set(tables) == set(names), sorted(names.values())
