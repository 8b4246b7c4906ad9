"""The ``gptq:…:gptqmodel`` preset against an independent transcription of GPTQModel 7.7.0's GPTQ
(tests/gptqmodel_transcription.py), to float32 rounding; its spec strings; the rows it writes."""

from __future__ import annotations

import pytest
import torch

from losslens.lm.quant import QuantSpec, SpecError, quantize
from losslens.lm.quant.gptq_preset import (
    SequenceHessian,
    gptqmodel_inverse_factor,
    gptqmodel_quantize,
    group_aware_order,
)
from tests import gptqmodel_transcription as oracle


def _problem(rows: int, cols: int, seed: int, dead: int = 0, rank_def: bool = False):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(rows, cols, generator=g) * torch.rand(1, cols, generator=g) * 0.2
    n = cols // 2 if rank_def else 4 * cols
    X = torch.randn(n, cols, generator=g) * (0.2 + 3 * torch.rand(cols, generator=g))
    H = oracle.hessian([X[: n // 2], X[n // 2 :]])
    if dead:
        H[:dead, :] = 0
        H[:, :dead] = 0
    return W, H


CASES = [  # (rows, cols, bits, g, sym, desc_act, dead, rank deficient)
    (24, 96, 4, 32, True, False, 0, False),
    (24, 96, 3, 32, True, False, 0, False),
    (16, 80, 2, 32, True, False, 3, False),  # tail of 16 columns, dead inputs
    (16, 300, 4, 64, False, False, 0, False),  # asymmetric, three blocks of 128, a tail
    (16, 64, 8, 16, True, False, 0, False),
    (16, 96, 4, 32, True, True, 0, False),  # desc_act instead of group-aware order
    (12, 96, 3, -1, True, True, 2, False),  # per-row grid with desc_act
    (12, 64, 4, 16, True, False, 0, True),  # rank-deficient H
]


@pytest.mark.parametrize("rows,cols,bits,g,sym,desc_act,dead,rank_def", CASES)
def test_preset_equals_transcription(rows, cols, bits, g, sym, desc_act, dead, rank_def):
    W, H = _problem(rows, cols, seed=rows * cols + bits, dead=dead, rank_def=rank_def)
    res = gptqmodel_quantize(W, H, bits, g, sym, desc_act, 0.05)
    ref, lam = oracle.gptqmodel_gptq(W, H, bits, g, sym, desc_act, 0.05)
    assert res.damping == lam
    assert res.weight.dtype == W.dtype
    diff = (res.weight - ref).abs().max().item()
    assert diff <= 2e-7 * W.abs().max().item(), diff
    assert not torch.equal(res.weight, W)


def test_group_aware_order_matches_transcription_and_keeps_groups_whole():
    diag = torch.rand(70, generator=torch.Generator().manual_seed(3))
    p = group_aware_order(diag, 16)
    assert p.tolist() == oracle.gar_order(diag, 16)
    assert sorted(p.tolist()) == list(range(70))
    for k in range(4):  # each run of 16 positions holds exactly one original group
        assert len({c // 16 for c in p[16 * k : 16 * (k + 1)].tolist()}) == 1
    assert p[64:].tolist() == list(range(64, 70))


def test_damping_walks_up_by_001_until_cholesky_succeeds():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(32, 32, generator=g)
    Qm, _ = torch.linalg.qr(A)
    ev = torch.linspace(0.5, 2.0, 32)
    ev[0] = -0.083  # mean(diag) = mean(ev): needs λ ≥ 0.083/mean → several 0.01 steps above 0.05
    H = (Qm * ev) @ Qm.T
    H = (H + H.T) / 2
    W = torch.randn(8, 32, generator=g)
    res = gptqmodel_quantize(W, H, 4, 16, True, False, 0.05)
    ref, lam = oracle.gptqmodel_gptq(W, H, 4, 16, True, False, 0.05)
    assert res.damping == lam > 0.05 + 1e-9
    lo = 0.083 / float(torch.mean(torch.diagonal(H)))
    assert lo < lam < lo + 0.0100001
    assert any("used damp" in n for n in res.notes)
    assert (res.weight - ref).abs().max().item() <= 2e-7 * W.abs().max().item()


def test_diagonal_floor_when_every_damp_fails():
    """Without increments (step 0) only the floors can help: eigenvalue −0.1 needs f + 0.05(1 + f) ≥ 0.1,
    i.e. the 6th floor 1e-6·10^5 = 0.1."""
    H = torch.eye(8)
    H[0, 1] = H[1, 0] = 1.1
    notes: list[str] = []
    U, lam = gptqmodel_inverse_factor(H.clone(), 0.05, 0.0, notes=notes)
    U_ref, lam_ref = oracle.inverse_factor(H.clone(), 0.05, 0.0)
    assert lam == lam_ref == 0.05
    assert "diagonal floor of 0.1" in notes[0]
    assert torch.allclose(U, U_ref, rtol=1e-6, atol=0)
    with pytest.raises(Exception, match="non positive-definite"):
        H[0, 1] = H[1, 0] = 2.0
        gptqmodel_inverse_factor(H, 0.05, 0.0)


def test_sequence_hessian_is_per_sequence_float32_sum():
    x = torch.randn(3, 20, 12, generator=torch.Generator().manual_seed(1))
    hook = SequenceHessian(12, "cpu")
    hook(None, (x[:2],))
    hook(None, (x[2:],))
    assert hook.n == 60
    assert torch.equal(hook.hessian(), oracle.hessian(list(x)))
    exact = 2 / 60 * torch.einsum("bsi,bsj->ij", x.double(), x.double())
    assert torch.allclose(hook.hessian().double(), exact, rtol=1e-5, atol=1e-6)


def test_spec_strings_of_the_preset():
    s = QuantSpec.parse("gptq:4:g128:gptqmodel")
    assert (s.variant, s.symmetric, s.damp) == ("gptqmodel", True, 0.05)
    assert str(s) == "gptq:4:g128:gptqmodel"
    assert str(QuantSpec.parse("gptq:3:g64:asym:damp=0.1:gptqmodel")) == "gptq:3:g64:asym:damp=0.1:gptqmodel"
    assert QuantSpec.parse("gptq:4:g128").variant == "reference"
    assert QuantSpec.parse("gptq:4:g128:sym") != QuantSpec.parse("gptq:4:g128:damp=0.05:sym:gptqmodel")
    assert s.to_dict()["variant"] == "gptqmodel"
    for bad in (
        "gptq:4:g128:static:gptqmodel",
        "gptq:4:g128:block=64:gptqmodel",
        "gptq:4:row:gptqmodel",
        "rtn:4:gptqmodel",
    ):
        with pytest.raises(SpecError):
            QuantSpec.parse(bad)


def _tiny(seed=0):
    from losslens.lm.models.families import tiny_model

    return tiny_model("gpt_neox", seed=seed)


def test_model_level_preset_uses_gptqmodel_per_layer_on_the_first_group():
    """First group of block 0 (fused QKV): its inputs are the FP model's, so the model-level preset
    must give exactly the transcription on H built from independently captured inputs."""
    model = _tiny()
    calib = torch.randint(0, 96, (4, 2, 24), generator=torch.Generator().manual_seed(5))
    name = "gpt_neox.layers.0.attention.query_key_value"
    lin = dict(model.named_modules())[name]
    seen = []
    h = lin.register_forward_pre_hook(lambda m, a: seen.extend(a[0].detach().clone()))
    with torch.no_grad():
        for b in calib:
            model(input_ids=b)
    h.remove()
    H = oracle.hessian(seen)
    ref, _ = oracle.gptqmodel_gptq(lin.weight.data, H, 4, 16)
    qm = quantize(model, "gptq:4:g16:gptqmodel", calibration=calib)
    got = dict(qm.model.named_modules())[name].weight.data
    assert (got - ref).abs().max().item() <= 2e-7 * lin.weight.abs().max().item()
    plain = dict(quantize(model, "gptq:4:g16:sym:damp=0.05", calibration=calib).model.named_modules())[name]
    assert not torch.equal(plain.weight.data, got)  # the reference variant differs (no reordering)


def _table(chosen: list[str]):
    import pandas as pd

    from losslens.study.sweep.store import RESULT_COLUMNS

    nan = float("nan")
    rows = [
        {
            "run": "r",
            "checkpoint": f"step-{k}",
            "step": k,
            "tokens": k,
            "lr": 0.0,
            "derived": False,
            "probe": "quant",
            "spec": "gptq:4:g128:gptqmodel",
            "metric": "rel_loss_error",
            "value": 0.1 * k,
            "stderr": nan,
            "ci_low": nan,
            "ci_high": nan,
            "n_hvp": 0,
            "seconds": 0.0,
            "status": "ok",
            "error": None,
            "seed": 0,
            "data_hash": "d",
            "converged": None,
            "threads": 1,
            "plan_hash": "p",
            "config_hash": "c",
            "chosen": c,
        }
        for k, c in enumerate(chosen)
    ]
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


def test_rows_record_the_variant_and_series_refuse_to_pool_variants():
    from losslens.study.analysis.inputs import AnalysisError
    from losslens.study.analysis.series import series
    from losslens.study.sweep.store_table import chosen_settings

    pre, ref = QuantSpec.parse("gptq:4:g128:gptqmodel"), QuantSpec.parse("gptq:4:g128")
    assert pre.row_settings == {"gptq_variant": "gptqmodel"} and ref.row_settings == {"gptq_variant": "reference"}
    assert QuantSpec.parse("rtn:4").row_settings == {}
    a, b = chosen_settings({"settings": pre.row_settings}), chosen_settings({"settings": ref.row_settings})
    assert "gptqmodel" in a and "reference" in b and chosen_settings({"settings": {}}) == ""
    assert list(series(_table([a, a, a]), "gptq:4:g128:gptqmodel").round(6)) == [0.0, 0.1, 0.2]
    with pytest.raises(AnalysisError, match="quantizer variants.*gptq_variant.*allow_mixed"):
        series(_table([a, b, a]), "gptq:4:g128:gptqmodel")
    assert len(series(_table([a, b, a]), "gptq:4:g128:gptqmodel", allow_mixed=True)) == 3
