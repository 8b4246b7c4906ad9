"""Weight excess kurtosis against scipy.stats.kurtosis(fisher=True, bias=True)."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from losslens.lm.models.weights import KurtosisResult, WeightStatsError, excess_kurtosis, weight_kurtosis
from tests.tiny_models import micro_gptneox


@pytest.mark.parametrize("dist", ["normal", "laplace", "uniform", "student"])
def test_excess_kurtosis_matches_scipy(dist):
    g = torch.Generator().manual_seed(0)
    n = 20_000
    x = (
        {
            "normal": torch.randn(n, generator=g),
            "laplace": torch.distributions.Laplace(0.0, 1.0).sample((n,)),
            "uniform": torch.rand(n, generator=g) * 3 + 1,
            "student": torch.distributions.StudentT(5.0).sample((n,)),
        }[dist]
        .reshape(100, -1)
        .float()
    )
    ref = stats.kurtosis(x.double().reshape(-1).numpy(), fisher=True, bias=True)
    assert excess_kurtosis(x) == pytest.approx(ref, rel=1e-10, abs=1e-10)


def test_known_values():
    assert excess_kurtosis(torch.tensor([-1.0, 1.0])) == pytest.approx(-2.0)
    assert excess_kurtosis(torch.tensor([0.0, 0.0, 0.0, 10.0])) == pytest.approx(stats.kurtosis([0, 0, 0, 10]))
    with pytest.raises(WeightStatsError, match="zero variance"):
        excess_kurtosis(torch.ones(5))
    with pytest.raises(WeightStatsError, match="non-finite"):
        excess_kurtosis(torch.tensor([1.0, float("nan")]))


def test_weight_kurtosis_per_matrix_and_pooled():
    model = micro_gptneox(seed=0)
    with torch.no_grad():  # make one matrix heavy-tailed
        model.gpt_neox.layers[0].mlp.dense_h_to_4h.weight[0, 0] = 5.0
    res = weight_kurtosis(model)
    assert isinstance(res, KurtosisResult)
    from losslens.lm.core.modules import select_linears

    lin = select_linears(model)
    assert tuple(res.per_matrix) == tuple(lin) and res.modules == tuple(lin)
    for name, mod in lin.items():
        assert res.per_matrix[name] == pytest.approx(stats.kurtosis(mod.weight.detach().double().reshape(-1).numpy()))
    pooled = torch.cat([m.weight.detach().double().reshape(-1) for m in lin.values()]).numpy()
    assert res.pooled == pytest.approx(stats.kurtosis(pooled, fisher=True, bias=True), rel=1e-9)
    assert res.n_params == pooled.size
    sub = weight_kurtosis(model, ["*dense_h_to_4h"])
    assert len(sub.per_matrix) == 2 and sub.max == max(sub.per_matrix.values())
    assert set(res.to_dict()) >= {"per_matrix", "pooled"}
