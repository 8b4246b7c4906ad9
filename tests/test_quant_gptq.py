"""Per-layer GPTQ against an independent, deliberately simple implementation (float64).

The oracle processes one column at a time with the explicit inverse Hessian and the OBS update
(δW = −e·Hinv[j, :]/Hinv[j, j], then Hinv ← Hinv − Hinv[:, j]Hinv[j, :]/Hinv[j, j]): no blocks,
no Cholesky trick. The one thing it must borrow from the reference is *which* weights a group's
grid is fitted on: the reference fits it on the outer matrix, which only has the updates of earlier
blocks of ``block_size`` columns — the oracle keeps a snapshot of W taken at every block start.
"""

from __future__ import annotations

import pytest
import torch

from losslens.lm.quant import CholeskyError, gptq_quantize, rtn_quantize


def grid(w: torch.Tensor, bits: int, sym: bool):
    """Per-row (scale, zero) of the reference quantizer, written out row by row."""
    maxq = 2**bits - 1
    scales, zeros = [], []
    for row in w:
        lo, hi = min(float(row.min()), 0.0), max(float(row.max()), 0.0)
        if sym:
            hi = max(abs(lo), hi)
            lo = -hi if lo < 0 else lo
        if lo == 0 and hi == 0:
            lo, hi = -1.0, 1.0
        s = (hi - lo) / maxq
        scales.append(s)
        zeros.append((maxq + 1) / 2 if sym else float(round(-lo / s)))
    return torch.tensor(scales, dtype=w.dtype), torch.tensor(zeros, dtype=w.dtype)


def q_col(w, scale, zero, bits):
    q = torch.clamp(torch.round(w / scale) + zero, 0, 2**bits - 1)
    return scale * (q - zero)


def gptq_oracle(W, H, bits, g=-1, sym=False, act=False, static=False, damp=0.01, block=128):
    W, H = W.clone(), H.clone()
    rows, cols = W.shape
    row_grid = grid(W, bits, sym)  # the reference fits the per-row grid before zeroing dead columns
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    H = H + damp * torch.mean(torch.diag(H)) * torch.eye(cols, dtype=H.dtype)
    order = torch.argsort(torch.diag(H), descending=True).tolist() if act else list(range(cols))
    static_grids = {a // g: grid(W[:, a : a + g], bits, sym) for a in range(0, cols, g)} if g != -1 else {}
    Hinv = torch.linalg.inv(H)
    Q = torch.zeros_like(W)
    current = row_grid
    snapshot = W.clone()
    for t, j in enumerate(order):
        if t % block == 0:
            snapshot = W.clone()
        if g != -1:
            if static:
                current = static_grids[j // g]
            elif t % g == 0:
                current = grid(snapshot[:, order[t : t + g]], bits, sym)
        q = q_col(W[:, j], *current, bits)
        Q[:, j] = q
        rest = order[t + 1 :]
        e = (W[:, j] - q) / Hinv[j, j]
        if rest:
            W[:, rest] -= torch.outer(e, Hinv[j, rest])
        Hinv = Hinv - torch.outer(Hinv[:, j], Hinv[j, :]) / Hinv[j, j]
    return Q


def random_layer(rows, cols, n, seed, dead=()):
    gen = torch.Generator().manual_seed(seed)
    mix = torch.randn(cols, cols, generator=gen, dtype=torch.float64) / cols**0.5
    X = torch.randn(n, cols, generator=gen, dtype=torch.float64) @ (torch.eye(cols, dtype=torch.float64) + mix)
    X = X * (0.2 + 3 * torch.rand(cols, generator=gen, dtype=torch.float64))  # uneven diag(H) for act-order
    for c in dead:
        X[:, c] = 0
    W = torch.randn(rows, cols, generator=gen, dtype=torch.float64) * 0.05
    H = (2.0 / n) * X.T @ X
    return W, H, X


CASES = [
    # bits, group, sym, act, static, block
    (4, -1, False, False, False, 128),
    (3, -1, False, True, False, 128),
    (4, 128, False, False, False, 128),
    (3, 128, False, False, False, 100),  # g128 groups start mid-block
    (4, 48, False, False, False, 128),  # g48 groups start mid-block
    (3, 128, False, True, False, 128),
    (4, 48, False, True, False, 64),
    (4, 128, False, True, True, 128),
    (3, 48, False, True, True, 100),
    (3, 128, False, False, True, 128),
    (4, 128, True, False, False, 128),
    (3, 48, True, True, False, 128),
    (2, 64, False, False, False, 128),
]


@pytest.mark.parametrize("bits, g, sym, act, static, block", CASES)
def test_gptq_matches_simple_oracle(bits, g, sym, act, static, block):
    W, H, _ = random_layer(24, 300, 600, seed=bits * 7 + max(g, 0), dead=(17,))
    got = gptq_quantize(W, H, bits, g, sym, act, static, 0.01, block)
    want = gptq_oracle(W, H, bits, g, sym, act, static, 0.01, block)
    rel = float((got.weight - want).norm() / want.norm())
    assert rel < 1e-5, rel
    assert got.weight.dtype == torch.float64
    assert got.damping == 0.01
    assert any("dead" in n for n in got.notes)
    assert torch.all(got.weight[:, 17] == 0)


def test_quirk_matters_when_groups_start_mid_block():
    # Fitting a group's grid on the fully updated columns (no quirk) gives a different answer,
    # so the oracle agreement above really pins the reference behaviour.
    W, H, _ = random_layer(24, 300, 600, seed=3)
    got = gptq_quantize(W, H, 3, 48, block_size=128).weight
    quirk = gptq_oracle(W, H, 3, 48, block=128)
    no_quirk = gptq_oracle(W, H, 3, 48, block=1)
    assert float((got - quirk).norm() / quirk.norm()) < 1e-5
    assert float((got - no_quirk).norm() / quirk.norm()) > 1e-3
    # with block size 1 our implementation equals the no-quirk oracle
    got1 = gptq_quantize(W, H, 3, 48, block_size=1).weight
    assert float((got1 - no_quirk).norm() / no_quirk.norm()) < 1e-5


def test_inputs_not_modified_and_float32():
    W, H, _ = random_layer(8, 64, 200, seed=5, dead=(3,))
    W0, H0 = W.clone(), H.clone()
    gptq_quantize(W, H, 4, 16, act_order=True)
    assert torch.equal(W, W0) and torch.equal(H, H0)
    res = gptq_quantize(W.float(), H.float(), 4, 16)
    assert res.weight.dtype == torch.float32
    want = gptq_oracle(W, H, 4, 16)
    assert float((res.weight.double() - want).norm() / want.norm()) < 1e-3


@pytest.mark.parametrize("bits, g, act", [(4, -1, False), (3, -1, True), (4, 32, False), (3, 32, True), (2, 64, False)])
def test_gptq_layer_output_error_below_rtn(bits, g, act):
    for seed in range(3):
        W, H, X = random_layer(32, 128, 512, seed=100 + seed)
        gq = gptq_quantize(W, H, bits, g, act_order=act).weight
        rq = rtn_quantize(W, bits, g)
        err_g = float(((X @ (gq - W).T) ** 2).sum())
        err_r = float(((X @ (rq - W).T) ** 2).sum())
        assert err_g < err_r, (seed, err_g, err_r)


def test_cholesky_retry_with_more_damping():
    W, H, _ = random_layer(4, 32, 100, seed=9)
    m = float(torch.diag(H).mean())
    lam_min = float(torch.linalg.eigvalsh(H)[0])
    bad = H - (lam_min + 0.05 * m) * torch.eye(32, dtype=H.dtype)  # smallest eigenvalue -0.05·m:
    # fails at damp 0.01, works at 0.1 (the mean diagonal drops by less than half)
    res = gptq_quantize(W, bad, 4, name="blk.0.proj")
    assert res.damping > 0.01
    assert any("Cholesky failed" in n and "damp=" in n for n in res.notes)
    assert torch.isfinite(res.weight).all()


def test_cholesky_failure_reports_layer():
    W, H, _ = random_layer(4, 16, 100, seed=9)
    bad = -H
    with pytest.raises(CholeskyError, match="blk.3.mlp"):
        gptq_quantize(W, bad, 4, name="blk.3.mlp", max_damp=1.0)
    nan = H.clone()
    nan[1, 2] = float("nan")
    with pytest.raises(CholeskyError, match="NaN"):
        gptq_quantize(W, nan, 4, name="x")
