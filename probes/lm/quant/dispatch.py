"""``quantize(model, spec, calibration)``: the one interface to every quantizer.

Weight-only fake quantization (docs/science.md §2): the selected ``nn.Linear`` weights are replaced by
full-precision tensors holding the dequantized values, so the result is an ordinary model of the
same class (HVPs, losses and surfaces work on it unchanged). By default every ``nn.Linear`` inside
the decoder blocks is quantized (embeddings, LM head and norms stay full precision); ``modules``
takes fnmatch globs on dotted module names instead.

Calibration (GPTQ only): a :class:`losslens.lm.core.tokenset.TokenSet`, a LongTensor [n_batches, batch, seq]
or [batch, seq], or a sequence of [batch, seq] LongTensors. Every token position is one row of the
layer-input matrix, so a set of N sequences × S tokens gives n = N·S rows per layer (the GPTQ paper
used 128 × 2048 C4 tokens). The set must hold at least as many token rows as the largest
``in_features`` of the selected layers (fewer rows leave H rank-deficient and GPTQ regularised only
by its damping); :class:`CalibrationError` otherwise. The default calibration set of the CLI is
:func:`losslens.lm.data.default_token_sets`'s ``"calibration"`` set, disjoint from the evaluation set.
"""

from __future__ import annotations

import copy
import time
from dataclasses import replace
from typing import Iterable, Sequence

import torch
from torch import nn

from losslens.lm.core.next_token_loss import LossError, check_batch
from losslens.lm.core.modules import select_linears
from losslens.lm.core.numerics import rel_error
from losslens.lm.core.tokenset import TokenSet

from losslens.lm.quant.quant_errors import CalibrationError, QuantizeError
from losslens.lm.quant.formats import FORMAT_METHODS, quantize_weight
from losslens.lm.quant.gptq import GPTQResult
from losslens.lm.quant.results import LayerReport, QuantizedModel, write_weight
from losslens.lm.quant.rtn import int8_quantize, rtn_quantize
from losslens.lm.quant.spec import QuantSpec


def calibration_batches(calibration, model: nn.Module | None = None) -> list[torch.Tensor]:
    """Normalise calibration data to a list of [batch, seq] LongTensors, checked against ``model``."""
    if calibration is None:
        raise CalibrationError("no calibration data given")
    if isinstance(calibration, TokenSet):
        batches = list(calibration)
    elif isinstance(calibration, torch.Tensor):
        if calibration.ndim == 2:
            batches = [calibration]
        elif calibration.ndim == 3:
            batches = list(calibration)
        else:
            raise CalibrationError(
                f"calibration tensor must be [n_batches, batch, seq] or [batch, seq], got {tuple(calibration.shape)}"
            )
    elif isinstance(calibration, Iterable):
        batches = list(calibration)
    else:
        raise CalibrationError(
            f"calibration must be a TokenSet, a LongTensor or a list of [batch, seq] LongTensors, got "
            f"{type(calibration).__name__}"
        )
    if not batches:
        raise CalibrationError("the calibration set is empty")
    for b in batches:
        if model is not None:
            try:
                check_batch(model, b)
            except LossError as e:
                raise CalibrationError(f"bad calibration batch: {e}") from None
        elif not isinstance(b, torch.Tensor) or b.ndim != 2:
            raise CalibrationError("calibration batches must be [batch, seq] LongTensors")
    return batches


def _check_enough(batches: list[torch.Tensor], linears: dict[str, nn.Linear]) -> None:
    rows = sum(int(b.shape[0] * b.shape[1]) for b in batches)
    need = max(lin.in_features for lin in linears.values())
    if rows < need:
        seq = int(batches[0].shape[1])
        raise CalibrationError(
            f"calibration too short: {rows} token rows but the widest quantized layer has {need} input features; "
            f"GPTQ needs at least {need} rows (>= {-(-need // seq)} sequences of {seq} tokens) for a full-rank H. "
            "Use more calibration batches."
        )


def quantize(
    model: nn.Module,
    spec: "QuantSpec | str",
    calibration=None,
    modules: "str | Sequence[str] | None" = None,
    inplace: bool = False,
    progress: bool = False,
) -> QuantizedModel:
    """Fake-quantize ``model``'s linear layers with ``spec`` and report per layer.

    Args:
        model: any ``nn.Module`` with decoder blocks (see :func:`losslens.lm.core.modules.find_blocks`) or
            explicit ``modules`` globs. It is not modified unless ``inplace``.
        spec: a :class:`QuantSpec` or its string (``"rtn:4:g128"``, ``"int8"``, ``"gptq:3:g128:act"``...).
        calibration: calibration token batches (see the module docstring); needed by GPTQ, ignored
            by calibration-free methods.
        modules: fnmatch globs selecting linears; default every Linear in the decoder blocks.
        inplace: quantize ``model`` itself instead of a deep copy (saves one model of memory).
        progress: show a progress bar.

    Returns:
        :class:`QuantizedModel` (``.model``, ``.spec``, ``.report``).

    ``had+SPEC`` runs SPEC inside :func:`losslens.lm.quant.hadamard.rotated_inputs` (weights W R, online input
    rotation) and rotates the result back; each layer's report then holds ‖Q(WR) − WR‖/‖WR‖, which equals
    ‖Q(WR)Rᵀ − W‖/‖W‖ (R orthogonal), and a note naming the rotation.

    Cost: RTN/INT8 and the formats of :mod:`losslens.lm.quant.formats` O(parameters); GPTQ one forward per calibration
    batch
    to capture block 0's inputs, then per block (#input groups + 2) block forwards over the calibration set and one
    Cholesky + O(out·in²) update per linear (see :mod:`losslens.lm.quant.sequential`).

    Raises:
        SpecError, CalibrationError, ModuleSelectionError, CholeskyError, BackendUnavailable: see
        :mod:`losslens.lm.quant.quant_errors`.
    """
    t0 = time.perf_counter()
    spec = QuantSpec.parse(spec)
    select_linears(model, modules)  # validate the selection before copying anything
    batches = None
    if spec.needs_calibration:
        if calibration is None:
            raise CalibrationError(f"{spec} needs calibration data (a TokenSet of token batches); RTN and INT8 do not")
        batches = calibration_batches(calibration, model)
        _check_enough(batches, select_linears(model, modules))
    target = model if inplace else copy.deepcopy(model)
    linears = select_linears(target, modules)
    if spec.hadamard:
        from losslens.lm.quant.hadamard import rotated_inputs

        with rotated_inputs(target, linears, spec.hadamard_seed) as notes:
            report = _dispatch(target, spec.unrotated, linears, batches, progress)
        report = [replace(r, notes=(notes[r.name],) + tuple(r.notes)) if r.name in notes else r for r in report]
    else:
        report = _dispatch(target, spec, linears, batches, progress)
    return QuantizedModel(model=target, spec=spec, report=report, seconds=time.perf_counter() - t0)


def _counted(linears: dict[str, nn.Linear], bar):
    """``linears``' items, counted on ``bar`` (a :class:`losslens.geometry.base.progress.Progress`) as each is done."""
    with bar:
        for item in linears.items():
            yield item
            bar.update()


def _dispatch(
    target: nn.Module, spec: QuantSpec, linears: dict[str, nn.Linear], batches, progress: bool
) -> list[LayerReport]:
    """Quantize ``linears`` of ``target`` in place with ``spec`` (no rotation); the per-layer reports."""
    from losslens.geometry.base.progress import progress_bar

    report: list[LayerReport] = []
    if spec.method in ("rtn", "int8"):
        for name, lin in _counted(linears, progress_bar(progress, len(linears), what=str(spec), unit="layer")):
            t = time.perf_counter()
            W = lin.weight.data
            new = (
                int8_quantize(W)
                if spec.method == "int8"
                else rtn_quantize(W, spec.bits, spec.group_size, spec.symmetric)
            )
            err = rel_error(new, W)
            write_weight(lin, new)
            report.append(LayerReport(name, err, time.perf_counter() - t))
    elif spec.method == "gptq":
        from losslens.lm.quant.sequential import gptq_sequential

        def on_layer(name: str, lin: nn.Linear, res: GPTQResult) -> None:
            err = rel_error(res.weight, lin.weight.data)
            write_weight(lin, res.weight)
            report.append(LayerReport(name, err, res.seconds, res.damping, tuple(res.notes)))

        gptq_sequential(target, batches, linears, spec, on_layer, progress=progress)
    elif spec.method == "awq":
        from losslens.lm.quant.awq import awq_model

        report = awq_model(target, batches, linears, spec, progress=progress)
    elif spec.method in ("gptqmodel", "bnb-int8", "bnb-nf4"):
        from losslens.lm.quant import backends

        report = backends.quantize_with_backend(target, spec, linears, batches, progress=progress)
    elif spec.method in FORMAT_METHODS:
        for name, lin in _counted(linears, progress_bar(progress, len(linears), what=str(spec), unit="layer")):
            t = time.perf_counter()
            new, notes = quantize_weight(lin.weight.data, spec)
            err = rel_error(new, lin.weight.data)
            write_weight(lin, new)
            report.append(LayerReport(name, err, time.perf_counter() - t, None, notes))
    else:  # pragma: no cover - QuantSpec validates methods
        raise QuantizeError(f"no quantizer for method {spec.method!r}")
    return report
