"""FP8, MXFP4/MXFP8, NVFP4 and the had+ rotation against independent references.

* FP8 and the minifloat rounding: torch's own ``float8_e4m3fn`` / ``float8_e5m2`` casts (C++ code).
* MX and NVFP4: an element-wise transcription here (grid enumerated from the bit-level definition,
  nearest value, ties to the even code; scale exponent from ``math.log2``; no shared code), the OCP
  MX v1.0 E2M1 value table, and hand-worked blocks from the spec's scale rule.
* had+: the rotated full-precision model computes the same loss; rotations are orthogonal.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from losslens.lm.quant import QuantSpec, SpecError, quantize
from losslens.lm.quant.quant_errors import QuantizeError
from losslens.lm.quant.microscaling import mx_quantize, nvfp4_quantize
from losslens.lm.quant.minifloat import E2M1, E4M3, E5M2, fp8_quantize, round_minifloat

SEEDS = (0, 1, 2)


def rows(seed: int, shape=(16, 96)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * torch.exp(2 * torch.randn(shape[0], 1, generator=g))


# ---------------------------------------------------------------- an independent transcription
def grid(e_bits: int, m_bits: int, bias: int, finite_max: float) -> list[tuple[float, int]]:
    """(value, code) of every finite non-negative value of the format, decoded from the bits."""
    out = []
    for code in range(2 ** (e_bits + m_bits)):
        e, m = code >> m_bits, code & ((1 << m_bits) - 1)
        v = (m / 2**m_bits) * 2.0 ** (1 - bias) if e == 0 else (1 + m / 2**m_bits) * 2.0 ** (e - bias)
        if v <= finite_max:
            out.append((v, code))
    return out


GRIDS = {"e2m1": grid(2, 1, 1, 6.0), "e4m3": grid(4, 3, 7, 448.0), "e5m2": grid(5, 2, 15, 57344.0)}


def nearest(v: float, name: str) -> float:
    """Nearest grid value to v, ties to the even code, saturating."""
    a = abs(v)
    best = min(GRIDS[name], key=lambda vc: (abs(a - vc[0]), vc[1] & 1))
    return math.copysign(best[0], v)


def mx_reference(block: list[float], elem: str, emax: int) -> list[float]:
    amax = max(abs(v) for v in block)
    if amax == 0:
        return [0.0] * len(block)
    X = 2.0 ** max(-127, min(127, math.floor(math.log2(amax)) - emax))
    return [X * nearest(v / X, elem) for v in block]


def f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def nvfp4_reference(W: torch.Tensor) -> list[list[float]]:
    vals = W.tolist()
    s_t = f32(f32(max(abs(v) for r in vals for v in r)) / f32(2688.0))
    out = []
    for r in vals:
        row = []
        for c in range(0, len(r), 16):
            blk = r[c : c + 16]
            s_b = nearest(f32(max(abs(v) for v in blk) / f32(6.0 * s_t)), "e4m3")
            S = f32(s_b * s_t)
            row += [0.0] * len(blk) if S == 0 else [f32(S * nearest(f32(v / S), "e2m1")) for v in blk]
        out.append(row)
    return out


# ---------------------------------------------------------------- FP8 vs torch
@pytest.mark.parametrize("fmt,dtype", [(E4M3, torch.float8_e4m3fn), (E5M2, torch.float8_e5m2)])
def test_minifloat_rounding_matches_torch_casts(fmt, dtype):
    every = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    every = every[torch.isfinite(every)].unique()
    mids = (every[1:] + every[:-1]) / 2  # exact ties: decided by ties-to-even
    for x in (every, mids, *(rows(s).clamp(-fmt.max_value, fmt.max_value).flatten() for s in SEEDS)):
        assert torch.equal(round_minifloat(x, fmt), x.to(dtype).float())


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fmt,dtype", [(E4M3, torch.float8_e4m3fn), (E5M2, torch.float8_e5m2)])
@pytest.mark.parametrize("per_channel", [True, False])
def test_fp8_quantize_equals_scaled_torch_cast(seed, fmt, dtype, per_channel):
    W = rows(seed)
    amax = W.abs().amax(dim=1, keepdim=True) if per_channel else W.abs().amax()
    s = amax / fmt.max_value
    assert torch.equal(fp8_quantize(W, fmt, per_channel), (W / s).to(dtype).float() * s)


def test_fp8_saturates_and_keeps_zero_rows():
    assert torch.equal(
        round_minifloat(torch.tensor([500.0, -1e9, float("inf")]), E4M3), torch.tensor([448.0, -448, 448])
    )
    W = rows(0)
    W[3] = 0
    assert torch.equal(fp8_quantize(W)[3], torch.zeros(W.shape[1]))


# ---------------------------------------------------------------- MX / NVFP4
def test_e2m1_values_are_the_ocp_table():
    assert [v for v, _ in GRIDS["e2m1"]] == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # OCP MX v1.0 §5.3.3
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.75, -5.0])
    # ties to the even mantissa: 0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4; 7 saturates to 6
    assert round_minifloat(x, E2M1).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -1.0, -4.0]


def test_mx_hand_worked_blocks():
    # amax 6: floor(log2 6) = 2 = emax(E2M1) → X = 1, elements are E2M1 values
    b = torch.tensor([[6.0, 1.0, 0.3, -2.6] + [0.0] * 28])
    assert mx_quantize(b)[0, :4].tolist() == [6.0, 1.0, 0.5, -3.0]
    # amax 7.9: X = 2^(2 − 2) = 1 still, 7.9 saturates to 6 (the spec's rule clips the largest element)
    b = torch.tensor([[7.9, 2.2] + [0.0] * 30])
    assert mx_quantize(b)[0, :2].tolist() == [6.0, 2.0]
    # amax 0.1: floor(log2 0.1) = −4 → X = 2^−6; 0.1/X = 6.4 → 6 → 0.09375
    b = torch.tensor([[0.1] + [0.0] * 31])
    assert mx_quantize(b)[0, 0].item() == pytest.approx(6 * 2.0**-6, abs=0)
    # MXFP8 E4M3: amax 1 → X = 2^(0 − 8); 0.3/X = 76.8 lies in E4M3's binade [64, 128) of step 8 → 80 → 0.3125
    b = torch.tensor([[1.0, 0.3] + [0.0] * 30])
    assert mx_quantize(b, E4M3)[0, :2].tolist() == [1.0, 0.3125]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("elem,emax", [("e2m1", 2), ("e4m3", 8), ("e5m2", 15)])
def test_mx_matches_transcription(seed, elem, emax):
    W = rows(seed, (6, 80))  # 80 = 2 full blocks + a short one
    W[0, :32] = 0
    ours = mx_quantize(W, {"e2m1": E2M1, "e4m3": E4M3, "e5m2": E5M2}[elem])
    ref = [sum((mx_reference(r[c : c + 32], elem, emax) for c in range(0, 80, 32)), []) for r in W.tolist()]
    assert ours.tolist() == ref


@pytest.mark.parametrize("seed", SEEDS)
def test_nvfp4_matches_transcription(seed):
    W = rows(seed, (6, 48))
    W[1, :16] *= 1e-5  # a block whose E4M3 scale underflows
    assert nvfp4_quantize(W).tolist() == nvfp4_reference(W)


def test_mx_agrees_with_ggml_mxfp4_except_ties():
    gguf = pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType as T

    for seed in SEEDS:
        W = rows(seed, (8, 256))
        ref = gguf.quants.dequantize(gguf.quants.quantize(W.numpy(), T.MXFP4), T.MXFP4)
        assert torch.equal(mx_quantize(W), torch.from_numpy(ref))
    tie = torch.tensor([[4.0, 0.75, 1.75, 3.5] + [0.0] * 28])  # X = 1; midpoints between E2M1 values
    ggml = gguf.quants.dequantize(gguf.quants.quantize(tie.numpy(), T.MXFP4), T.MXFP4)[0, :4].tolist()
    assert mx_quantize(tie)[0, :4].tolist() == [4.0, 1.0, 2.0, 4.0]  # OCP: ties to even
    assert ggml == [4.0, 0.5, 1.5, 3.0]  # ggml: the first (smaller) table entry wins a tie


# ---------------------------------------------------------------- specs and had+
def test_specs_round_trip_and_refuse():
    for s in (
        "fp8",
        "fp8:e5m2",
        "fp8:tensor",
        "fp8:e5m2:tensor",
        "mxfp4",
        "mxfp8",
        "mxfp8:e5m2",
        "nvfp4",
        "gguf:Q4_0",
        "gguf:Q4_K",
        "had+rtn:4:g128",
        "had3+gptq:4:g128",
        "had+gguf:Q8_0",
        "had+mxfp4",
    ):
        assert str(QuantSpec.parse(s)) == s
    assert str(QuantSpec.parse("GGUF:q4_k")) == "gguf:Q4_K"
    assert not QuantSpec.parse("gguf:Q4_K").needs_calibration and QuantSpec.parse("had+gptq:4").needs_calibration
    for bad, msg in (
        ("fp8:4", "unknown token"),
        ("gguf:Q3_K", "Q4_K"),
        ("mxfp4:e5m2", "no options"),
        ("had+had+rtn:4", "one had+"),
        ("had+gptqmodel:4", "saved copy"),
        ("nvfp4:sym", "unknown"),
    ):
        with pytest.raises(SpecError, match=msg):
            QuantSpec.parse(bad)


def tiny(hidden=64, inter=256):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(
        vocab_size=96,
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=inter,
        max_position_embeddings=32,
        use_cache=False,
    )
    torch.manual_seed(0)
    return GPTNeoXForCausalLM(cfg).eval()


def test_rotation_preserves_the_function_and_is_orthogonal():
    from losslens.lm.core.next_token_loss import lm_loss
    from losslens.lm.core.modules import select_linears
    from losslens.lm.quant.hadamard import Rotation, rotated_inputs

    for n in (64, 96):  # 96 = 3 · 32: block-diagonal
        R = Rotation(n, seed=1)
        M = R.apply(torch.eye(n, dtype=torch.float64))
        assert torch.allclose(M @ M.T, torch.eye(n, dtype=torch.float64), atol=1e-12)
        assert not torch.allclose(M.abs(), torch.eye(n, dtype=torch.float64))
    model = tiny(hidden=96, inter=192)
    ids = torch.randint(0, 96, (3, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        base = lm_loss(model, ids).item()
        rot = copy.deepcopy(model)
        lin = select_linears(rot, None)
        with rotated_inputs(rot, lin, seed=5) as notes:
            assert any("blocks of 32" in v for v in notes.values())
            inside = lm_loss(rot, ids).item()
            assert not torch.allclose(
                lin["gpt_neox.layers.0.mlp.dense_h_to_4h"].weight, model.gpt_neox.layers[0].mlp.dense_h_to_4h.weight
            )
        after = lm_loss(rot, ids).item()
    assert inside == pytest.approx(base, rel=1e-6) and after == pytest.approx(base, rel=1e-6)
    for (_, p), (_, q) in zip(model.named_parameters(), rot.named_parameters()):
        assert torch.allclose(p, q, atol=1e-6)


def test_had_quantize_is_q_of_rotated_weight_rotated_back():
    from losslens.lm.quant.hadamard import Rotation
    from losslens.lm.quant.rtn import rtn_quantize

    model = tiny()
    qm = quantize(model, "had2+rtn:3:g32")
    W = model.gpt_neox.layers[1].mlp.dense_4h_to_h.weight.detach().double()
    R = Rotation(256, 2)
    expect = R.apply_t(rtn_quantize(R.apply(W).float(), 3, 32).double())
    assert torch.allclose(qm.model.gpt_neox.layers[1].mlp.dense_4h_to_h.weight.double(), expect, atol=1e-6)
    assert all("Hadamard" in r.notes[0] for r in qm.report)
    with pytest.raises(QuantizeError, match="even in_features"):
        Rotation(63, 0)


def test_every_format_runs_through_quantize():
    model = tiny()
    for s in ("fp8", "fp8:e5m2:tensor", "mxfp4", "mxfp8", "nvfp4", "gguf:Q4_0", "gguf:Q8_0", "gguf:Q4_K"):
        qm = quantize(model, s)
        errs = [r.rel_weight_error for r in qm.report]
        assert all(0 < e < 0.3 for e in errs), (s, errs)
    notes = {r.name: r.notes for r in quantize(model, "gguf:Q4_K").report}
    assert "Q5_0" in notes["gpt_neox.layers.0.attention.query_key_value"][0]  # in_features 64: llama.cpp's fallback
    assert notes["gpt_neox.layers.0.mlp.dense_4h_to_h"] == ()  # in_features 256: real Q4_K


def test_sweep_plans_and_the_explain_probe_take_the_new_specs():
    from losslens.measure.explain import explain_specs
    from losslens.study.sweep.plan import canonical_spec

    assert canonical_spec("GGUF:q4_k") == "gguf:Q4_K" and canonical_spec("had2+mxfp4") == "had2+mxfp4"
    model = tiny()
    ids = torch.randint(0, 96, (4, 16), generator=torch.Generator().manual_seed(3))
    exps = explain_specs(model, ["mxfp4", "had+gguf:Q4_0"], [ids], trace_matvecs=4)
    assert [e.spec for e in exps] == ["mxfp4", "had+gguf:Q4_0"]
    for e in exps:
        assert all(0 < v < 0.3 for v in e.layer_errors.values())
        assert e.factors.norm2 > 0


def test_had_wraps_calibrated_quantizers_on_rotated_inputs():
    from losslens.lm.core.next_token_loss import lm_loss

    model = tiny()
    g = torch.Generator().manual_seed(4)
    cal = torch.randint(0, 96, (2, 8, 32), generator=g)
    ids = torch.randint(0, 96, (4, 32), generator=g)
    with torch.no_grad():
        base = lm_loss(model, ids).item()
        for spec in ("had+gptq:4:g32", "had+awq:4:g32"):
            qm = quantize(model, spec, calibration=cal)
            assert all(r.notes and "Hadamard" in r.notes[0] for r in qm.report), spec
            assert abs(lm_loss(qm.model, ids).item() - base) < 0.05 * base, spec
    for name, lin in qm.model.named_modules():  # no rotation hook is left behind
        assert not getattr(lin, "_forward_pre_hooks", {}), name


def test_had_refuses_a_tied_weight():
    from losslens.lm.core.modules import select_linears
    from losslens.lm.quant.hadamard import rotated_inputs

    model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Linear(8, 10, bias=False))
    model[1].weight = model[0].weight
    with pytest.raises(QuantizeError, match="tied"), rotated_inputs(model, select_linears(model, "1")):
        pass
