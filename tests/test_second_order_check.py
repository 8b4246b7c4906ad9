"""The second-order check at scale and against token-dependent gradient masking.

- a large or half-precision model is checked on a float64 miniature of its architecture;
- the check's batch carries the special tokens, and a probe vector sits on their embedding rows,
  so an op that masks the gradient of one token (as ``padding_idx`` does) is caught even when the
  data slice never contains that token.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from losslens.lm.models.families import FAMILIES, tiny_model
from losslens.lm.models.fd_references import special_token_ids, with_special_tokens
from losslens.lm.models.miniature import miniature
from losslens.lm.models.second_order import SecondOrderError, check_second_order, ensure_second_order


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_miniature_keeps_class_vocabulary_and_special_tokens(family):
    model = tiny_model(
        family, seed=0, hidden_size=64, num_attention_heads=4, num_hidden_layers=6, intermediate_size=256
    )
    mini = miniature(model)
    assert type(mini) is type(model) and next(mini.parameters()).dtype == torch.float64
    assert sum(p.numel() for p in mini.parameters()) < sum(p.numel() for p in model.parameters())
    assert mini.config.vocab_size == model.config.vocab_size
    assert mini.config.pad_token_id == model.config.pad_token_id
    assert mini.config.num_hidden_layers == 4
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    assert mini(input_ids=ids).logits.shape == (2, 12, model.config.vocab_size)


def test_half_precision_model_is_checked_on_a_miniature():
    model = tiny_model("llama", seed=0, dtype=torch.bfloat16)
    rep = check_second_order(model, torch.randint(0, 96, (2, 16)))
    assert rep.checked_on == "float64 miniature" and rep.dtype == "float64" and rep.ok
    assert any("miniature" in m for m in rep.messages)


def test_the_check_batch_carries_every_special_token():
    model = tiny_model("olmo", seed=0)
    ids = special_token_ids(model)
    assert {0, 1, 2} <= set(ids)  # bos, pad, eos of the family config
    batch = torch.full((2, 16), 50)
    out = with_special_tokens(model, batch)
    assert set(ids) <= set(out[0].tolist()) and torch.equal(batch, torch.full((2, 16), 50))


class _MaskedLookup(torch.autograd.Function):
    """Embedding lookup whose backward zeroes row ``pad`` (a padding rule outside nn.Embedding)."""

    @staticmethod
    def forward(ctx, ids, weight, pad):
        ctx.save_for_backward(ids)
        ctx.shape, ctx.pad = weight.shape, pad
        return weight[ids]

    @staticmethod
    def backward(ctx, g):
        (ids,) = ctx.saved_tensors
        grad = torch.zeros(ctx.shape, dtype=g.dtype, device=g.device).index_add(
            0, ids.reshape(-1), g.reshape(-1, ctx.shape[1])
        )
        keep = torch.ones(ctx.shape[0], 1, dtype=g.dtype, device=g.device)
        keep[ctx.pad] = 0
        return None, grad * keep, None


class _MaskedEmbedding(nn.Module):
    def __init__(self, weight: torch.Tensor, pad: int):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())
        self.pad = pad

    def forward(self, ids):
        return _MaskedLookup.apply(ids, self.weight, self.pad)


def test_token_masking_op_is_caught_although_the_data_lacks_the_token():
    model = tiny_model("llama", seed=1, pad_token_id=1)
    model.set_input_embeddings(_MaskedEmbedding(model.get_input_embeddings().weight, pad=1))
    data = torch.randint(3, 96, (2, 16), generator=torch.Generator().manual_seed(0))  # no special token
    with pytest.raises(SecondOrderError, match="WRONG Hessian|raised"):
        ensure_second_order(model, data, cache=False)
    rep = check_second_order(model, data)
    assert not rep.reverse.ok and not rep.forward.ok
    assert "_MaskedLookup" in " ".join(rep.custom_functions)
