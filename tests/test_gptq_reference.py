"""The native GPTQ equals a transcription of the published algorithm (issue #23, item 5).

:mod:`tests.gptq_transcription` writes GPTQ from the paper's equations and the IST-DASLab reference's
structure (blocks of 128 with lazy batch updates, dead columns, damping, act-order, static groups,
group grids refitted at group boundaries on the outer matrix). Here :func:`losslens.lm.quant.gptq_quantize`
must equal it to 1e-12 (max abs difference relative to max |W|) in float64 over seeds, bit widths,
group sizes, act-order, static groups, symmetric grids, block sizes and in-features that are not a
multiple of the block size.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from losslens.lm.quant import gptq_quantize
from losslens.lm.quant.sequential import _HessianHook
from tests.gptq_transcription import HessianAccumulator, transcribed_gptq

TOL = 1e-12


def layer(rows: int, cols: int, n: int, seed: int, dead=(), extreme_dead: bool = False):
    """A weight [rows, cols] and H = 2/n XᵀX of correlated inputs with uneven scales (float64)."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(cols, cols, generator=g, dtype=torch.float64) / cols**0.5
    X = torch.randn(n, cols, generator=g, dtype=torch.float64) @ (torch.eye(cols, dtype=torch.float64) + mix)
    X = X * (0.2 + 3 * torch.rand(cols, generator=g, dtype=torch.float64))
    X[:, list(dead)] = 0
    W = torch.randn(rows, cols, generator=g, dtype=torch.float64) * 0.05
    if extreme_dead and dead:
        W[:, dead[0]] = 0.5 * torch.sign(torch.randn(rows, generator=g, dtype=torch.float64))  # each row's extreme
    return W, (2.0 / n) * X.T @ X


def rel_max(a: torch.Tensor, b: torch.Tensor, W: torch.Tensor) -> float:
    return float((a - b).abs().max() / W.abs().max())


GROUPS = (-1, 32, 48, 128)
CASES = [  # (bits, group, act, static, sym, cols, block)
    (b, g, act, static, sym, cols, block)
    for b, g, act, static, sym, cols, block in itertools.product(
        (2, 3, 4, 8), GROUPS, (False, True), (False, True), (False, True), (300, 256), (128, 100)
    )
    if not (static and g == -1)
]


@pytest.mark.parametrize("seed", range(6))
def test_native_gptq_equals_the_transcription(seed):
    # every combination, each on its own layer; 300 in-features: the last block is 44 columns wide
    worst = 0.0
    cases = CASES[seed::6]
    for i, (bits, g, act, static, sym, cols, block) in enumerate(cases):
        W, H = layer(16, cols, 2 * cols, seed=1000 * seed + i, dead=(5, 200))
        got = gptq_quantize(W, H, bits, g, sym, act, static, 0.01, block).weight
        want = transcribed_gptq(W, H, bits, g, sym, act, static, 0.01, block)
        err = rel_max(got, want, W)
        assert err < TOL, (bits, g, act, static, sym, cols, block, err)
        assert torch.all(got[:, [5, 200]] == 0)
        worst = max(worst, err)
    assert len(cases) >= 74 and worst < TOL


def test_dead_column_holding_a_rows_extreme_uses_the_grid_of_the_loaded_weight():
    # The reference fits the per-row grid (group_size = -1) before it zeroes dead columns; a dead
    # column that holds a row's largest weight therefore widens that row's grid.
    for seed in range(3):
        W, H = layer(12, 200, 400, seed=50 + seed, dead=(7,), extreme_dead=True)
        got = gptq_quantize(W, H, 3, -1).weight
        want = transcribed_gptq(W, H, 3, -1)
        assert rel_max(got, want, W) < TOL
        zeroed = W.clone()
        zeroed[:, 7] = 0
        other = transcribed_gptq(zeroed, H, 3, -1)  # the grid fitted after zeroing: a different answer
        assert rel_max(other, want, W) > 1e-3


def test_result_does_not_depend_on_the_scale_of_H():
    # the reference divides by sequences, the native driver by token rows: H differs by a factor
    W, H = layer(8, 160, 320, seed=9)
    for g, act in ((-1, False), (32, True)):
        a = gptq_quantize(W, H, 4, g, act_order=act).weight
        b = gptq_quantize(W, 64.0 * H, 4, g, act_order=act).weight
        assert rel_max(a, b, W) < TOL


def test_hessian_collection_equals_the_reference_running_mean():
    g = torch.Generator().manual_seed(3)
    hook = _HessianHook(24, torch.device("cpu"), torch.float64, stop=False)
    acc = HessianAccumulator(24)
    tokens = 0
    for b in (3, 1, 4):
        x = torch.randn(b, 10, 24, generator=g, dtype=torch.float64)  # [batch, seq, in]
        hook(None, (x,))
        acc.add(x.reshape(-1, 1, 24))  # token rows as the leading dim: the reference then counts tokens
        tokens += b * 10
    assert hook.n == acc.n == tokens
    assert float((hook.hessian() - acc.H).abs().max() / acc.H.abs().max()) < TOL
