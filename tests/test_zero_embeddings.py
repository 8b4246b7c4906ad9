"""Tokens whose input-embedding row is zero are left out of curvature losses (issue #35,
probes/lm/models/zero_embeddings.py). On the six seed families (float64, the padding row zeroed, the
padding token in the batches) the difference backend through ``lm_hessian`` agrees with the exact
products of the same loss at the clean level (≤ 1e-8; benchmarks/README.md "Zero embedding rows"),
the loss is what it says (right padding: the mean over the unpadded sequences' targets, computed
without a mask), and the count is recorded."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from losslens.geometry import HessianOperator
from losslens.geometry.operators.product_check import product_error
from losslens.lm.core.next_token_loss import ExcludingLoss, LossError, evaluate, lm_loss
from losslens.lm.models.curvature import lm_hessian
from losslens.lm.models.families import FAMILIES, tiny_model
from losslens.lm.models.fidelity import float64_fidelity
from losslens.lm.models.zero_embeddings import curvature_loss, row_extra, zero_embedding_tokens

SEQ = 10


def _setting(family: str, seed: int = 0):
    """Float64 tiny model with the padding row zeroed; two [2, SEQ] batches holding the padding token
    (row 0 of the first right-padded by 3, one position inside the second)."""
    model = tiny_model(family, seed=seed, dtype=torch.float64, hidden_size=16, intermediate_size=32)
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 1
    with torch.no_grad():
        model.get_input_embeddings().weight[pad] = 0.0
    ids = (model.get_input_embeddings().weight.abs().sum(1) != 0).nonzero().reshape(-1)
    g = torch.Generator().manual_seed(seed)
    batches = [ids[torch.randint(0, len(ids), (2, SEQ), generator=g)] for _ in range(2)]
    batches[0][0, -3:] = pad
    batches[1][1, SEQ // 2] = pad
    return model, pad, batches


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_difference_products_are_clean_with_a_zero_embedding_row_in_the_batch(family):
    model, pad, batches = _setting(family)
    assert zero_embedding_tokens(model) == (pad,)
    op = lm_hessian(model, batches, backend="difference")
    # 4 padding positions; targets dropped: 3 (row 0 of batch 0) + 2 (before and after the inner one)
    assert op.excluded["zero_embedding_tokens"] == [pad] and op.excluded["positions"] == 4
    assert op.excluded["targets"] == 5 and op.weights == pytest.approx((15 / 31, 16 / 31), rel=1e-15)
    assert row_extra(op) == {"excluded": op.excluded}  # what trace / eigen sweep rows carry
    with float64_fidelity():
        exact = HessianOperator(model, ExcludingLoss(lm_loss, (pad,)), batches)
        assert product_error(op, exact, 2, seed=0) <= 1e-8
        assert op.checked()["rel_error"] <= 1e-8
        lean = lm_hessian(model, batches)  # reverse backend, lean LM head: the same loss
        assert product_error(lean, exact, 2, seed=1) <= 1e-10


def test_without_the_exclusion_the_difference_backend_is_off():
    model, _, batches = _setting("apertus", seed=0)
    with float64_fidelity():
        plain = product_error(
            HessianOperator(model, lm_loss, batches, backend="difference"),
            HessianOperator(model, lm_loss, batches),
            2,
            seed=0,
        )
    assert plain > 1e-4  # 5.0e-3 measured; 6.4e-10 with the exclusion


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_the_excluding_loss_is_the_unpadded_token_mean(family):
    model, pad, _ = _setting(family)
    g = torch.Generator().manual_seed(3)
    batch = torch.randint(3, 96, (3, SEQ), generator=g)
    lengths = [SEQ, SEQ - 4, SEQ - 1]
    for r, n in enumerate(lengths):
        batch[r, n:] = pad
    loss = ExcludingLoss(lm_loss, (pad,))
    got = loss(model, batch)
    grad = torch.autograd.grad(got, list(model.parameters()))
    # the oracle: each sequence alone without its padding, no mask, summed over its targets
    total = sum(
        F.cross_entropy(model(input_ids=batch[r : r + 1, :n]).logits[0, :-1], batch[r, 1:n], reduction="sum")
        for r, n in enumerate(lengths)
    )
    want = total / sum(n - 1 for n in lengths)
    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-12)
    for a, b in zip(grad, torch.autograd.grad(want, list(model.parameters()))):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-13)
    assert loss.batch_weight(batch) == sum(n - 1 for n in lengths)
    assert evaluate(model, [batch], loss_fn=loss).n_tokens == sum(n - 1 for n in lengths)


def test_nothing_to_exclude_leaves_the_loss_alone():
    model = tiny_model("llama", seed=0, dtype=torch.float64)
    assert zero_embedding_tokens(model) == () and curvature_loss(lm_loss, zero_embedding_tokens(model)) is lm_loss
    op = lm_hessian(model, [torch.randint(0, 96, (2, 6), generator=torch.Generator().manual_seed(0))])
    assert op.excluded["positions"] == 0 and row_extra(op) == {}


def test_a_set_of_excluded_tokens_only_is_refused_by_evaluate():
    model, pad, _ = _setting("llama")
    with pytest.raises(LossError, match="every token of the set is excluded"):
        evaluate(model, [torch.full((1, 4), pad)], loss_fn=ExcludingLoss(lm_loss, (pad,)))
