"""RTN and INT8 against direct element-by-element loops of the docs/science.md §3 formulas."""

from __future__ import annotations

import math

import pytest
import torch

from losslens.lm.quant import int8_quantize, rtn_quantize


def rtn_loop(W: torch.Tensor, bits: int, g: int) -> torch.Tensor:
    """docs/science.md §3 literally: per row, per group of g consecutive columns (last one short)."""
    rows, cols = W.shape
    g = cols if g == -1 else g
    out = W.clone()
    maxq = 2**bits - 1
    for r in range(rows):
        for a in range(0, cols, g):
            vals = [float(W[r, c]) for c in range(a, min(a + g, cols))]
            lo, hi = min(min(vals), 0.0), max(max(vals), 0.0)
            s = (hi - lo) / maxq
            if s == 0:
                continue  # left exact
            z = round(-lo / s)  # python round is half-to-even, like torch.round
            for k, c in enumerate(range(a, min(a + g, cols))):
                q = min(max(round(vals[k] / s) + z, 0), maxq)
                out[r, c] = s * (q - z)
    return out


def int8_loop(W: torch.Tensor) -> torch.Tensor:
    out = W.clone()
    for r in range(W.shape[0]):
        s = max(abs(float(v)) for v in W[r]) / 127
        if s == 0:
            continue
        for c in range(W.shape[1]):
            out[r, c] = s * min(max(round(float(W[r, c]) / s), -127), 127)
    return out


@pytest.mark.parametrize(
    "bits, g, shape",
    [
        (4, 128, (6, 256)),
        (3, -1, (5, 70)),
        (2, 16, (4, 64)),
        (8, 32, (3, 96)),
        (4, 32, (5, 100)),  # 100 = 3*32 + 4: last group short
        (3, 128, (4, 300)),  # 300 = 2*128 + 44
        (4, 128, (3, 50)),  # group larger than the row: one short group
    ],
)
def test_rtn_matches_loop(bits, g, shape):
    gen = torch.Generator().manual_seed(bits * 1000 + shape[1])
    W = torch.randn(*shape, generator=gen, dtype=torch.float64) * 0.1
    W[0, :] += 0.3  # an all-positive-ish row: lo clamps to 0
    got = rtn_quantize(W, bits, g)
    want = rtn_loop(W, bits, g)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert got.dtype == W.dtype and got.shape == W.shape
    # at most 2^b distinct values per (row, group)
    gg = W.shape[1] if g == -1 else g
    for a in range(0, W.shape[1], gg):
        assert len(torch.unique(got[1, a : a + gg])) <= 2**bits


def test_rtn_edge_groups():
    W = torch.randn(3, 40, dtype=torch.float64)
    W[0, 0:8] = 0.0  # all-zero group: left exact (zeros)
    W[1, 8:16] = 0.37  # constant positive group: range [0, .37] -> exact
    W[2, 16:24] = -1.25  # constant negative group: range [-1.25, 0] -> exact
    W[2, 32:40] = 0.0  # short last group of zeros (40 = 4*8 + 8... use g=12 below too)
    for g in (8, 12):
        got = rtn_quantize(W, 3, g)
        torch.testing.assert_close(got, rtn_loop(W, 3, g), rtol=0, atol=1e-12)
    got = rtn_quantize(W, 3, 8)
    assert torch.equal(got[0, 0:8], torch.zeros(8, dtype=W.dtype))
    torch.testing.assert_close(got[1, 8:16], W[1, 8:16], rtol=0, atol=1e-15)
    torch.testing.assert_close(got[2, 16:24], W[2, 16:24], rtol=0, atol=1e-15)
    # zero is always representable: exact zeros stay zero
    W2 = torch.randn(4, 64, dtype=torch.float64)
    W2[:, ::5] = 0
    assert torch.all(rtn_quantize(W2, 4, 16)[:, ::5] == 0)


def test_rtn_short_last_group_not_padded():
    # a short last group gets its own min/max: padding with zeros would not change it here, but
    # padding with copies of other columns would; check the last group's grid is its own.
    W = torch.zeros(1, 10, dtype=torch.float64)
    W[0, :8] = torch.linspace(-4, 4, 8)
    W[0, 8:] = torch.tensor([0.01, 0.02])
    got = rtn_quantize(W, 2, 8)
    s = 0.02 / 3
    torch.testing.assert_close(got[0, 8:], torch.tensor([round(0.01 / s) * s, 0.02], dtype=torch.float64))


def test_rtn_float32_and_bf16_dtype_kept():
    W = torch.randn(8, 64)
    assert rtn_quantize(W, 4, 32).dtype == torch.float32
    Wb = W.to(torch.bfloat16)
    assert rtn_quantize(Wb, 4, 32).dtype == torch.bfloat16


def test_rtn_error_decreases_with_bits():
    W = torch.randn(16, 256, dtype=torch.float64)
    errs = [float((rtn_quantize(W, b, 64) - W).norm()) for b in (2, 3, 4, 8)]
    assert errs == sorted(errs, reverse=True)
    # with b bits and range R the error per weight is at most s/2
    got = rtn_quantize(W, 4, 64)
    for a in range(0, 256, 64):
        blk = W[:, a : a + 64]
        s = (blk.max(1).values.clamp(min=0) - blk.min(1).values.clamp(max=0)) / 15
        assert torch.all((got[:, a : a + 64] - blk).abs() <= s[:, None] / 2 + 1e-12)


def test_int8_matches_loop():
    W = torch.randn(7, 50, dtype=torch.float64)
    W[3] = 0.0  # all-zero channel: exact
    W[4, 10] = 25.0  # outlier sets that channel's scale
    got = int8_quantize(W)
    torch.testing.assert_close(got, int8_loop(W), rtol=0, atol=1e-12)
    assert torch.equal(got[3], W[3])
    assert math.isclose(float(got[4, 10]), 25.0, rel_tol=1e-12)  # absmax is exactly representable
    assert int8_quantize(W.float()).dtype == torch.float32
