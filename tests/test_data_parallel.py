"""Data-parallel Hessian products (geometry/operators/data_parallel.py, issue #26): 2 gloo processes,
one thread each, give the same products, gradient, trace and λ_max as one process over all the
batches (float64, to 1e-10), with an uneven split (3 batches of 3, 5 and 2 rows over 2 ranks);
failures are one error on every rank, never a hang."""

from __future__ import annotations

import pytest
import torch

from losslens.geometry import HessianOperator
from losslens.geometry.operators.data_parallel import split_batches
from tests import dp_worker
from tests.gloo_ranks import run_ranks
from tests.tiny_models import lm_loss, micro_gptneox


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Run every scenario of tests/dp_worker.py once on 2 spawned ranks; {scenario: [rank results]}."""
    return run_ranks(dp_worker.run, tmp_path_factory.mktemp("dp"))


def test_two_ranks_equal_one_process_over_all_batches(ranks):
    single = dp_worker.estimates(HessianOperator(micro_gptneox(seed=1), lm_loss, dp_worker.lm_batches()))
    for r, res in enumerate(ranks["same"]):
        assert "ok" in res, res.get("trace")
        got = res["ok"]
        assert got["num_batches"] == [2, 1][r]  # 3 batches over 2 ranks
        for key in ("loss", "trace", "lambda"):
            assert got[key] == pytest.approx(single[key], rel=1e-10, abs=1e-12), key
        for key in ("hv", "grad"):
            err = (got[key] - single[key]).norm() / single[key].norm()
            assert err < 1e-10, (key, float(err))
    # token weights normalised over all ranks: 3+5 rows on rank 0, 2 on rank 1, of 10
    assert ranks["same"][0]["ok"]["weights"] == pytest.approx((0.3, 0.5))
    assert ranks["same"][1]["ok"]["weights"] == pytest.approx((0.2,))
    # every rank holds the same (all-reduced) numbers
    assert torch.equal(ranks["same"][0]["ok"]["hv"], ranks["same"][1]["ok"]["hv"])


def test_a_failing_rank_is_one_error_on_every_rank(ranks):
    for res in ranks["rank_fails"]:
        assert res.get("error") == "RankError", res
        assert "failed on rank 1 of 2" in res["message"] and "this rank's loss broke" in res["message"]


def test_a_rank_without_batches_is_refused_on_every_rank(ranks):
    for res in ranks["empty_rank"]:
        assert res.get("error") == "RankError", res
        assert "rank 1 of 2 got no curvature batch" in res["message"]


def test_ranks_that_build_different_operators_are_refused(ranks):
    for res in ranks["mismatch"]:
        assert res.get("error") == "RankError", res
        assert "the Hessian operator differs between ranks" in res["message"] and "dim:" in res["message"]


def test_split_batches_is_contiguous_and_refuses_too_few():
    assert [split_batches(list(range(7)), r, 3) for r in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]
    with pytest.raises(ValueError, match="2 curvature batches cannot be split over 3 ranks"):
        split_batches([0, 1], 2, 3)


def test_data_parallel_without_a_process_group_says_what_to_do():
    from losslens.geometry import OperatorError
    from tests.tiny_models import random_batches

    with pytest.raises(OperatorError, match="initialised torch.distributed process group"):
        HessianOperator(micro_gptneox(seed=0), lm_loss, random_batches(), data_parallel=True)
