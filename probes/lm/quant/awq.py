"""AWQ: activation-aware weight quantization (Lin et al., 2024), weight-only fake quantization.

For every group of linears that read the same input tensor inside a decoder block (q/k/v read the
attention norm's output, gate/up the MLP norm's output, o_proj and down_proj are alone — found by
the same tensor-identity rule as the GPTQ driver, :func:`losslens.lm.quant.sequential.discover_groups`,
no per-model table), with calibration inputs x ∈ R^{in} (n token rows, ``X`` [n, in]):

1. **Scale search.** x̄ = mean_t ``|x_t|`` per input channel. For α ∈ {0, 1/N, …, (N−1)/N} (N = 20):
   s = clamp(x̄^α, min=1e-4), s ← s / sqrt(max(s)·min(s)); every linear j of the group is
   fake-quantized as Ŵ_j = Q(W_j·diag(s))·diag(s)⁻¹ with Q the asymmetric INT-b RTN grid of
   docs/science.md §3 (group size g along the input, per row when in ≤ g); the group's output error is

       E(α) = Σ_j ‖X (Ŵ_j − W_j)ᵀ‖²_F / (n · Σ_j out_j)

   (mean squared error over every token and every output feature of the group's linears; biases
   cancel). The α with the lowest E wins (first one on ties; α = 0 is plain RTN, so E(α*) ≤ E_RTN).
2. **Clipping search**, per linear on the scaled weight W' = W·diag(s) with inputs X' = X·diag(s)⁻¹
   (the inputs the scaled weight sees): for every (output row, input group) the quantization range
   [lo, hi] = [min(w, 0), max(w, 0)] is shrunk to [r·lo, r·hi] for r ∈ {1, 1 − 0.5/20, …, 0.5}
   (21 ratios: 1.0 down to 0.5 in 20 steps), the weights clamped to it and quantized, and the r
   minimising that group's partial output error mean_t (x'_{t,g} · (q − w')_g)² is kept (first on
   ties, so r = 1 unless clipping helps). Because the per-group choices ignore cross-group terms
   of a row's output, the clipped weight is kept only when it does not increase the linear's total
   output error on the calibration inputs (a guard the reference lacks; with one group per row it
   never triggers). Hence the final group error ≤ E(α*) ≤ E_RTN on the calibration inputs.

**What the guarantee covers, and what it does not.** E ≤ E(α*) ≤ E_RTN holds per input-sharing
group, for the group's summed linear outputs, on the calibration inputs of the full-precision
model (one linear of a group may be worse than its own RTN; the group sum is not). Each layer's
report records it (``LayerReport.objective``, a :class:`~losslens.lm.quant.results.CalibObjective`:
E_RTN, E(α*), E, α, group, n) and ``QuantError.calib_objective_ratio`` is the mean over groups of
E / E_RTN (≤ 1). It says nothing about the model's loss: the output MSE weighs every output
feature and token alike, while the loss does not, and clipping shrinks layer outputs (0.6–1.2%
on the model below), a bias the MSE counts like rounding noise. So **ΔQ L of AWQ can exceed
RTN's on held-out data**. Measured on the tiny trained GPT-NeoX (``losslens train-tiny --schedule
wsd``, step 800, default token sets; issue #12): at 4 bits, g128, every group's E is 12–34% below
RTN's (on held-out inputs too), yet at training seed 0 ΔQ L = 0.00203 (AWQ) vs 0.00137 (RTN) on
the evaluation set — a paired per-sequence difference of z = +1.5, noise level (0.00253 vs 0.00258
on the calibration set) — while training seeds 1 and 2 go the other way (z = −2.0, −1.1). At 3
bits AWQ lowers ΔQ L by 28–48% on all three (z = −3.6 to −7.0). Neither direction at 4 bits is a defect:
α = 0 without clipping is RTN bit for bit, and the scale folding leaves the FP loss unchanged to
8e-9.

**Weight-only fake quantization.** The reference folds diag(s)⁻¹ into the previous op (a norm's
weight or the previous linear) and stores Q(W·diag(s)); the layer then computes
(x·diag(s)⁻¹)·Q(W·diag(s))ᵀ. Here the linear holds Ŵ = Q(W·diag(s))·diag(s)⁻¹ and computes
x·Ŵᵀ = x·diag(s)⁻¹·Q(W·diag(s))ᵀ — the same function in exact arithmetic (diagonal scalings
commute with the sum over input channels), without any per-architecture knowledge of the
previous op; in floating point the two differ by rounding of the scaling (~1 ulp). The model
stays an ordinary model of its class (HVPs and surfaces apply unchanged).

**Calibration activations.** As in the reference (llm-awq ``run_awq``), every block is searched on
the activations of the *full-precision* model: one forward per block over the calibration inputs
collects, per group, the Gram matrix XᵀX and Σ|x| (hooks; the block-input capture of
:mod:`losslens.lm.quant.sequential`), and the block's FP output is the next block's input. The errors
above are evaluated exactly from the Gram matrix (‖X Dᵀ‖²_F = Σ (D·XᵀX) ⊙ D), on all calibration
tokens (the reference subsamples 512 tokens for clipping).

Differences from the reference, all documented choices: the scale search inspects the group's
linear outputs (the reference inspects its parent module's output, e.g. the attention block's,
which needs a per-architecture table); clipping shrinks the asymmetric range [min, max] (the
reference clamps to ±r·max|w|) over 21 ratios down to 0.5 (reference: 10 ratios down to 0.55);
q/k projections are clipped like every other linear (the reference skips them by name).

Spec: ``awq:BITS[:GROUP][:sym][:grid=N][:clip=0|1][:shrink=F]`` (default ``awq:4:g128``).
Cost: per block one forward over the calibration set; per group N·(#linears) RTN passes and
O(out·in²) error evaluations; per linear 21 clipping candidates at O(out·in·g).
"""

from __future__ import annotations

import time
from typing import Sequence

import torch
from torch import nn

from losslens.geometry.base.modes import module_modes
from losslens.lm.core.numerics import rel_error

from losslens.lm.quant.quant_errors import QuantizeError
from losslens.lm.quant.results import CalibObjective, LayerReport, write_weight
from losslens.lm.quant.awq_search import CLIP_GRID, MAX_SHRINK, N_GRID, _work_dtype, awq_search
from losslens.lm.quant.rtn import rtn_quantize
from losslens.lm.quant.sequential import (
    _call_model,
    _run_block,
    _Stop,
    capture_block_inputs,
    discover_groups,
    partition_by_block,
)

__all__ = ["HELD_OUT_NOTE", "awq_model"]

HELD_OUT_NOTE = (
    "AWQ minimises each layer group's output error on the calibration set, where it is never above "
    "RTN's at the same bits; ΔQ L is measured on the held-out evaluation set, where AWQ can be worse "
    "than RTN (the layer error is a proxy for the loss). Compare AWQ with RTN at the same bits over "
    "several seeds before calling either better."
)


class _StatsHook:
    """Accumulates XᵀX and Σ|x| over the token rows of a linear's input (forward pre-hook)."""

    def __init__(self, in_features: int, device, dtype):
        self.G = torch.zeros(in_features, in_features, device=device, dtype=dtype)
        self.abs = torch.zeros(in_features, device=device, dtype=dtype)
        self.n = 0

    def __call__(self, mod, args):
        x = args[0].detach().reshape(-1, args[0].shape[-1]).to(self.G.dtype)
        self.G.addmm_(x.t(), x)
        self.abs.add_(x.abs().sum(dim=0))
        self.n += x.shape[0]


def _options(spec) -> dict:
    ex = dict(spec.extra)
    try:
        n_grid = int(ex.get("grid", N_GRID))
        clip = ex.get("clip", "1") not in ("0", "false", "no", "off")
        shrink = float(ex.get("shrink", MAX_SHRINK))
    except ValueError as e:
        raise QuantizeError(f"bad AWQ option in {spec}: {e}") from None
    if n_grid < 1 or not 0 <= shrink < 1:
        raise QuantizeError(f"AWQ needs grid >= 1 and 0 <= shrink < 1 (got grid={n_grid}, shrink={shrink})")
    ratios = [1 - shrink * i / CLIP_GRID for i in range(CLIP_GRID + 1)]
    return {"n_grid": n_grid, "clip": clip, "clip_ratios": ratios}


@torch.no_grad()
def awq_model(
    model: nn.Module,
    batches: Sequence[torch.Tensor],
    linears: dict[str, nn.Linear],
    spec,
    progress: bool = False,
    on_group=None,
) -> list:
    """AWQ-quantize ``linears`` of ``model`` in place; returns one :class:`LayerReport` per linear.

    ``on_group(result: AWQGroupResult)`` (optional) sees every group's search. Linears that never
    run on the calibration data are RTN-quantized with a note. Cost: see the module docstring.
    """
    from losslens.geometry.base.progress import progress_bar

    opts = _options(spec)
    report: list = []

    def search(sel: dict[str, nn.Linear], names: list[str], hook: _StatsHook) -> None:
        if hook.n == 0:
            for name in names:
                t0 = time.perf_counter()
                lin = sel[name]
                new = rtn_quantize(lin.weight.data, spec.bits, spec.group_size, spec.symmetric)
                err = rel_error(new, lin.weight.data)
                write_weight(lin, new)
                report.append(
                    LayerReport(
                        name,
                        err,
                        time.perf_counter() - t0,
                        None,
                        ("never called on the calibration data; quantized with RTN instead",),
                    )
                )
            return
        res = awq_search(
            hook.G,
            hook.abs / hook.n,
            hook.n,
            {n: sel[n].weight.data for n in names},
            spec.bits,
            spec.group_size,
            spec.symmetric,
            **opts,
        )
        if on_group is not None:
            on_group(res)
        per = res.seconds / len(names)
        objective = CalibObjective(
            rtn=res.rtn_error,
            scaled=res.scaled_error,
            final=res.error,
            alpha=res.alpha,
            group=tuple(names),
            n_tokens=res.n_tokens,
        )
        for name in names:
            lin = sel[name]
            err = rel_error(res.weights[name], lin.weight.data)
            write_weight(lin, res.weights[name])
            clipped = res.clipped.get(name, False)
            frac = float((res.clip_ratios[name] < 1).double().mean()) if name in res.clip_ratios else 0.0
            notes = (
                f"awq alpha={res.alpha:.2f} group={'+'.join(n.rsplit('.', 1)[-1] for n in names)} "
                f"output MSE rtn={res.rtn_error:.4g} scaled={res.scaled_error:.4g} final={res.error:.4g}",
                f"clipping {'kept' if clipped else 'not used'} ({frac:.0%} of groups shrunk)",
            )
            report.append(LayerReport(name, err, per, None, notes, objective=objective))

    blocks, in_block, outside = partition_by_block(model, linears)
    n_in_blocks = sum(len(sel) for sel in in_block)
    device = next(model.parameters()).device
    with module_modes(model, training=False):
        try:
            if outside:  # FP activations of linears outside the blocks: collected before anything changes
                groups = discover_groups(
                    lambda: _call_model(model, batches[0].to(device=device, dtype=torch.long)), outside
                )
                hooks = {}
                handles = []
                for names in groups:
                    first = outside[names[0]]
                    hooks[names[0]] = _StatsHook(
                        first.in_features, first.weight.device, _work_dtype(first.weight.dtype)
                    )
                    handles.append(first.register_forward_pre_hook(hooks[names[0]]))
                try:
                    for ids in batches:
                        _call_model(model, ids.to(device=device, dtype=torch.long))
                finally:
                    for h in handles:
                        h.remove()
                outside_stats = [(names, hooks[names[0]]) for names in groups]
            if n_in_blocks:
                inps = capture_block_inputs(model, blocks[0], batches)
                bar = progress_bar(progress, n_in_blocks, what=str(spec), unit="layer", label="quantize")
                last = max(k for k, sel in enumerate(in_block) if sel)
                for k, block in enumerate(blocks):
                    sel = in_block[k]
                    groups = discover_groups(lambda: _run_block(block, inps[0]), sel) if sel else []
                    hooks, handles = {}, []
                    for names in groups:
                        first = sel[names[0]]
                        hooks[names[0]] = _StatsHook(
                            first.in_features, first.weight.device, _work_dtype(first.weight.dtype)
                        )
                        handles.append(first.register_forward_pre_hook(hooks[names[0]]))
                    try:
                        for i, inp in enumerate(inps):  # one FP pass: statistics + next block's inputs
                            out = _run_block(block, inp)
                            if k < last:
                                inps[i] = (out.detach(), inp[1], inp[2])
                    finally:
                        for h in handles:
                            h.remove()
                    for names in groups:
                        search(sel, names, hooks[names[0]])
                        bar.update(len(names))
                    if k >= last:
                        break
                bar.close()
                del inps
            if outside:
                for names, hook in outside_stats:
                    search(outside, names, hook)
        except _Stop:  # pragma: no cover - no hook here stops a forward
            raise QuantizeError("AWQ forward stopped unexpectedly") from None
    return report
