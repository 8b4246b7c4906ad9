"""Parameter spaces, the LM loss, token sets and the block finder (the shared core)."""

import math

import pytest
import torch
from torch import nn

from losslens.geometry.operators.dense import DenseOperator
from losslens.geometry.operators.interface import OperatorError
from losslens.geometry.base.params import ParameterSelectionError, ParamSpace, select_parameters
from losslens.lm.core.next_token_loss import LossError, evaluate, lm_loss
from losslens.lm.core.modules import ModuleSelectionError, find_blocks, select_linears
from losslens.lm.core.tokenset import TokenSet, TokenSetError


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def test_select_parameters_globs_and_errors():
    m = _mlp()
    assert list(select_parameters(m)) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert list(select_parameters(m, "*.weight")) == ["0.weight", "2.weight"]
    assert list(select_parameters(m, ["2.*", "0.bias"])) == ["0.bias", "2.weight", "2.bias"]
    with pytest.raises(ParameterSelectionError, match="matches no trainable parameter"):
        select_parameters(m, "layers.*")
    m[0].weight.requires_grad_(False)
    assert "0.weight" not in select_parameters(m)


def test_param_space_round_trip_and_shape_errors():
    m = _mlp()
    space = ParamSpace.from_params(select_parameters(m))
    assert space.dim == 3 * 4 + 4 + 4 * 2 + 2
    flat = torch.arange(space.dim, dtype=torch.float32)
    d = space.unflatten(flat)
    assert d["0.weight"].shape == (4, 3) and torch.equal(space.flatten(d), flat)
    batched = torch.randn(5, space.dim)
    assert torch.equal(space.flatten(space.unflatten(batched), batched=True), batched)
    with pytest.raises(ParameterSelectionError, match="missing"):
        space.flatten({"0.weight": d["0.weight"]})
    bad = dict(d, **{"0.bias": torch.zeros(5)})
    with pytest.raises(ParameterSelectionError, match="0.bias"):
        space.flatten(bad)
    with pytest.raises(ParameterSelectionError, match="expected"):
        space.unflatten(torch.zeros(space.dim + 1))


def test_param_space_groups():
    space = ParamSpace.from_params(select_parameters(_mlp()))
    assert space.groups("module") == {"0": ["0.weight", "0.bias"], "2": ["2.weight", "2.bias"]}
    assert space.groups({"first": "0.*"}) == {"first": ["0.weight", "0.bias"], "other": ["2.weight", "2.bias"]}
    with pytest.raises(ParameterSelectionError):
        space.groups({"x": "nothing.*"})


def test_dense_operator_validation_and_scipy():
    H = torch.tensor([[2.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    op = DenseOperator(H)
    v = torch.tensor([1.0, -1.0], dtype=torch.float64)
    assert torch.allclose(op.matvec_flat(v), H @ v)
    assert op.num_matvecs == 1
    with pytest.raises(OperatorError, match="k = 0"):
        op.matmat_flat(torch.zeros(0, 2, dtype=torch.float64))
    with pytest.raises(OperatorError, match="length 3"):
        op.matmat_flat(torch.zeros(1, 3, dtype=torch.float64))
    lo = op.to_scipy()
    assert (lo @ v.numpy()).tolist() == pytest.approx((H @ v).tolist())
    with pytest.raises(OperatorError, match="NaN"):
        DenseOperator(torch.full((2, 2), float("nan"))).matvec_flat(torch.ones(2))


class _Bigram(nn.Module):
    def __init__(self, vocab=7):
        super().__init__()
        self.emb = nn.Embedding(vocab, vocab)

    def forward(self, ids):
        return self.emb(ids)


def test_lm_loss_is_mean_next_token_cross_entropy():
    torch.manual_seed(1)
    model = _Bigram()
    batch = torch.randint(0, 7, (3, 5))
    logp = torch.log_softmax(model.emb.weight, dim=-1)
    manual = -sum(float(logp[batch[b, t], batch[b, t + 1]]) for b in range(3) for t in range(4)) / 12
    assert float(lm_loss(model, batch)) == pytest.approx(manual, rel=1e-6)
    res = evaluate(model, [batch, batch[:1]])
    assert res.n_tokens == 16 and res.ppl == pytest.approx(math.exp(res.loss))
    with pytest.raises(LossError, match="empty"):
        evaluate(model, [])
    with pytest.raises(LossError, match="at least 2 tokens"):
        evaluate(model, [batch[:, :1]])


def test_token_set_hash_save_load(tmp_path):
    t = torch.arange(2 * 3 * 4).reshape(2, 3, 4)
    ts = TokenSet(t, "eval", {"source": "test"})
    assert ts.content_hash == TokenSet(t.clone(), "other").content_hash
    assert ts.content_hash != TokenSet(t + 1).content_hash
    assert [b.shape for b in ts] == [(3, 4), (3, 4)]
    back = TokenSet.load(ts.save(tmp_path / "eval.safetensors"))
    assert torch.equal(back.tokens, t) and back.meta == {"source": "test"} and back.name == "eval"
    with pytest.raises(TokenSetError, match="empty"):
        TokenSet(torch.zeros(0, 3, 4, dtype=torch.long))
    with pytest.raises(TokenSetError, match="has 2 batches, 3 were asked for"):
        ts.subset(3)
    with pytest.raises(TokenSetError, match="no token set file"):
        TokenSet.load(tmp_path / "missing.safetensors")


def test_find_blocks_generic_rule():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM

    neox = GPTNeoXForCausalLM(
        GPTNeoXConfig(vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    )
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=32,
            hidden_size=16,
            num_hidden_layers=3,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=32,
        )
    )
    assert find_blocks(neox)[0] == "gpt_neox.layers"
    assert find_blocks(llama)[0] == "model.layers" and len(find_blocks(llama)[1]) == 3
    names = list(select_linears(llama))
    assert len(names) == 3 * 7 and "lm_head" not in names
    assert list(select_linears(llama, "*.mlp.down_proj")) == [f"model.layers.{i}.mlp.down_proj" for i in range(3)]
    with pytest.raises(ModuleSelectionError, match="matches no nn.Linear"):
        select_linears(llama, "*.nothing")
    with pytest.raises(ModuleSelectionError):
        find_blocks(nn.Sequential(nn.Linear(2, 2)))
