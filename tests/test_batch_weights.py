"""Batches are weighted by their target tokens by default (issue #35, docs/science.md §4): with
batches of unequal length the curvature is of the pooled token-mean loss that ``evaluate()``
reports, in one process, data-parallel and FSDP2-sharded (2 gloo ranks). The oracle is a plain
double backward of the mean over the concatenated per-token losses, never through an operator."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from losslens.geometry import HessianOperator
from losslens.geometry.base.batches import default_batch_weight, normalise_batch_weights
from tests import tokens_worker
from tests.gloo_ranks import run_ranks
from tests.tiny_models import lm_loss, micro_llama


def _token_losses(model, batch: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=batch).logits
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="none")


def _oracle_products(model, batches, V: torch.Tensor, rows: bool = False) -> torch.Tensor:
    """H V of the pooled token mean (or, ``rows``, of the row-weighted mean of batch means), by double backward."""
    params = [p for p in model.parameters()]
    if rows:
        sizes = torch.tensor([float(b.shape[0]) for b in batches], dtype=torch.float64)
        loss = sum(w * _token_losses(model, b).mean() for w, b in zip(sizes / sizes.sum(), batches))
    else:
        loss = torch.cat([_token_losses(model, b) for b in batches]).mean()
    grads = torch.autograd.grad(loss, params, create_graph=True)
    g = torch.cat([x.reshape(-1) for x in grads])
    out = []
    for v in V:
        row = torch.autograd.grad(g @ v, params, retain_graph=True)
        out.append(torch.cat([x.reshape(-1) for x in row]))
    return torch.stack(out).detach()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def setting():
    model = micro_llama(seed=1)
    batches = tokens_worker.unequal_batches()
    dim = sum(p.numel() for p in model.parameters())
    V = tokens_worker.probes(dim)
    return model, batches, V, _oracle_products(model, batches, V)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_ranks(tokens_worker.run, tmp_path_factory.mktemp("tokens"))


def test_probes_losses_carry_their_target_count():
    from losslens.lm.core.next_token_loss import lm_loss as probe_loss, target_count
    from losslens.lm.core.lm_head import lm_loss_lean
    from losslens.lm.models.fidelity import FidelityLoss

    batch = torch.zeros(3, 7, dtype=torch.long)
    for loss in (probe_loss, lm_loss_lean, FidelityLoss(probe_loss), lm_loss):
        assert default_batch_weight(batch, loss) == target_count(batch) == 18
    assert default_batch_weight(batch) == 3  # a loss without batch_weight: rows, as before
    assert normalise_batch_weights([batch[:1], batch], loss_fn=probe_loss) == (0.25, 0.75)


def test_the_test_can_tell_token_from_row_weights(setting):
    model, batches, V, want = setting
    assert _rel(_oracle_products(model, batches, V, rows=True), want) > 1e-2


@pytest.mark.parametrize("backend", ["reverse", "forward"])
def test_one_process_hessian_is_the_pooled_token_mean_hessian(setting, backend):
    model, batches, V, want = setting
    op = HessianOperator(model, lm_loss, batches, backend=backend)
    assert op.weights == pytest.approx([16 / 39, 12 / 39, 11 / 39], rel=1e-15)
    assert _rel(op.matmat_flat(V), want) < 1e-8


def test_the_operators_loss_is_what_evaluate_reports(setting):
    from losslens.lm.core.next_token_loss import evaluate, lm_loss as probe_loss

    model, batches, _, _ = setting
    loss, _ = HessianOperator(model, probe_loss, batches).gradient()
    pooled = float(torch.cat([_token_losses(model, b) for b in batches]).mean().detach())
    assert float(loss) == pytest.approx(pooled, rel=1e-12)
    assert evaluate(model, batches).loss == pytest.approx(pooled, rel=1e-12)


@pytest.mark.parametrize("scenario", ["data", "fsdp"])
def test_distributed_hessian_is_the_pooled_token_mean_hessian(setting, ranks, scenario):
    want = setting[3]
    results = [res.get("ok") for res in ranks[scenario]]
    assert all(r is not None for r in results), [res.get("trace") for res in ranks[scenario]]
    weights = [w for r in results for w in r["weights"]]
    assert weights == pytest.approx([16 / 39, 12 / 39, 11 / 39], rel=1e-15)
    if scenario == "data":  # every rank holds the whole product
        for r in results:
            assert _rel(r["hv"], want) < 1e-8
    else:  # each rank holds its own columns
        assert _rel(sum(r["hv"] for r in results), want) < 1e-8


@pytest.mark.parametrize("scenario", ["fsdp-zero-row", "data-zero-row"])
def test_distributed_lm_hessians_leave_zero_embedding_tokens_out(ranks, scenario):
    """Issue #35's zero-row exclusion over 2 ranks: the row is found (on the sharded embedding for
    FSDP2, every rank agreeing), the counts are summed over the ranks, and the products are those of
    the loss without the token (a single-process reverse operator of the same loss, 1e-8)."""
    from losslens.lm.core.next_token_loss import ExcludingLoss, lm_loss as probe_loss
    from losslens.lm.models.fidelity import float64_fidelity

    results = [res.get("ok") for res in ranks[scenario]]
    assert all(r is not None for r in results), [res.get("trace") for res in ranks[scenario]]
    model, batches = tokens_worker.zero_row_model(), tokens_worker.padded_batches()
    for r in results:
        assert r.get("found", (tokens_worker.PAD,)) == (tokens_worker.PAD,)
        assert r["excluded"]["positions"] == 5 and r["excluded"]["targets"] == 6
    # as each runs: sharded_lm_hessian (gradient differences) under float64 fidelity, lm_hessian's reverse without
    with float64_fidelity() if scenario.startswith("fsdp") else contextlib.nullcontext():
        want = HessianOperator(model, ExcludingLoss(probe_loss, (tokens_worker.PAD,)), batches).matmat_flat(
            tokens_worker.probes(sum(p.numel() for p in model.parameters()))
        )
    got = sum(r["hv"] for r in results) if scenario.startswith("fsdp") else results[0]["hv"]
    assert _rel(got, want) < 1e-8
    if scenario.startswith("data"):
        assert _rel(results[1]["hv"], want) < 1e-8
