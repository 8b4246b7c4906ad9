"""FSDP2-sharded curvature (geometry/operators/sharded.py, issue #27): 2 gloo processes with
``fully_shard``-ed tiny models (float64) give the same Hutchinson and Hutch++ traces and power /
Lanczos λ_max as the unsharded gradient-difference backend over all the batches (to 1e-8), with an
uneven split (3 batches of 3, 5 and 2 rows over 2 ranks); each rank's vectors hold its shard only;
θ is unchanged after the products; unsupported estimators refuse in one line."""

from __future__ import annotations

import pytest

from losslens.geometry import HessianOperator
from tests import fsdp_worker
from tests.gloo_ranks import WORLD, run_ranks
from tests.tiny_models import lm_loss


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_ranks(fsdp_worker.run, tmp_path_factory.mktemp("fsdp"))


@pytest.mark.parametrize("family", sorted(fsdp_worker.FAMILIES))
def test_sharded_estimates_equal_the_unsharded_difference_backend(ranks, family):
    model = fsdp_worker.FAMILIES[family](seed=1)
    single = fsdp_worker.estimates(HessianOperator(model, lm_loss, fsdp_worker.lm_batches(), backend="difference"))
    n = sum(p.numel() for p in model.parameters())
    results = [res.get("ok") for res in ranks[f"same-{family}"]]
    assert all(r is not None for r in results), [res.get("trace") for res in ranks[f"same-{family}"]]
    for got in results:
        for key in ("trace", "hutchpp", "lanczos", "power"):
            assert got[key] == pytest.approx(single[key], rel=1e-8), key
        assert got["global_dim"] == n and got["unchanged"]
        # the ReLU model's branches are recorded at θ on every rank, for every round of every call
        assert (got["recorded"] > 0) == (family == "llama-relu")
    # each rank holds its own shard: the shards partition the vector, padded to one common length
    assert sum(r["local_dim"] for r in results) == n
    assert all(r["dim"] == max(x["local_dim"] for x in results) for r in results)
    assert all(abs(r["local_dim"] - n / WORLD) <= 0.15 * n for r in results)  # about 1/N each


def test_unsupported_estimators_refuse_sharded_operators(ranks):
    for res in ranks["refuses-slq"]:
        assert res.get("error") == "EstimatorError", res
        assert "spectral_density does not run on sharded operators yet" in res["message"]


def test_half_precision_shards_are_refused_unless_half_compute_is_asked_for(ranks):
    """FSDP2 shards cannot be upcast in place: a model sharded in bfloat16 is refused by default
    (float32 compute), in one line naming the fix, and accepted with compute_dtype="bfloat16"."""
    for res in ranks["refuses-half-shards"]:
        assert res.get("error") == "OperatorError", res
        assert "sharded in bfloat16" in res["message"] and "shard_model(model, compute_dtype=" in res["message"]
    for res in ranks["half-shards-on-request"]:
        assert res.get("ok") == {"dtype": "torch.bfloat16"}, res
