"""Quantization error of a model (docs/science.md §2): ΔQ L = L(θ̂)/L(θ) − 1 and
ΔQ PPL = exp(L(θ̂) − L(θ)) − 1."""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from losslens.lm.core.next_token_loss import LossResult, evaluate
from losslens.lm.models.weights import weight_kurtosis

from losslens.lm.quant.dispatch import calibration_batches, quantize
from losslens.lm.quant.quant_errors import CalibrationError
from losslens.lm.quant.spec import QuantSpec


@dataclass(frozen=True)
class QuantError:
    """Loss degradation of one model under one quantizer.

    Attributes:
        spec: canonical spec string (``str(QuantSpec)``).
        fp_loss, q_loss: mean next-token CE (nats) of the full-precision and quantized model on the
            evaluation set.
        rel_loss_error: ΔQ L = q_loss / fp_loss − 1.
        ppl_gap: ΔQ PPL = exp(q_loss − fp_loss) − 1.
        fp_ppl, q_ppl: exp of the losses.
        layer_errors: ‖Ŵ − W‖/‖W‖ per quantized layer.
        kurtosis: pooled excess kurtosis of the quantized weight matrices
            (:func:`losslens.lm.models.weights.weight_kurtosis` on the quantized model, same layers).
        seconds: wall time of quantization plus the quantized (and, if computed here, FP) evaluation.
        n_tokens: evaluation targets; quant_seconds: time spent quantizing; notes: per-layer notes.
        calib_objective_ratio: for AWQ, the mean over its input-sharing groups of E / E_RTN, the
            group output MSE on the calibration inputs relative to plain RTN's
            (:attr:`losslens.lm.quant.QuantizedModel.calib_objective_ratio`; ≤ 1 by construction). It is
            what AWQ optimises; ``rel_loss_error`` is measured on the evaluation set and can be
            *worse* than RTN's at the same bits although this ratio is < 1 (:mod:`losslens.lm.quant.awq`).
            None for every other method.
    """

    spec: str
    fp_loss: float
    q_loss: float
    rel_loss_error: float
    ppl_gap: float
    fp_ppl: float
    q_ppl: float
    layer_errors: dict
    kurtosis: float
    seconds: float
    n_tokens: int = 0
    quant_seconds: float = 0.0
    notes: tuple[str, ...] = field(default=())
    calib_objective_ratio: float | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["notes"] = list(self.notes)
        return d


def _row_hashes(batches) -> set[bytes]:
    out = set()
    for b in batches:
        for row in b.reshape(-1, b.shape[-1]).to(torch.int64):
            out.add(hashlib.blake2b(row.numpy().tobytes(), digest_size=16).digest())
    return out


def check_disjoint(eval_set, calibration) -> None:
    """Raise :class:`CalibrationError` when any evaluation sequence also appears in the calibration set."""
    common = _row_hashes(eval_set) & _row_hashes(calibration)
    if common:
        raise CalibrationError(
            f"{len(common)} evaluation sequence(s) also appear in the calibration set; docs/science.md "
            "§1 requires disjoint sets (build them with losslens.lm.data.build_token_sets)"
        )


def quantization_error(
    model: nn.Module,
    spec: "QuantSpec | str",
    eval_set,
    calibration=None,
    modules=None,
    fp_loss: "float | LossResult | None" = None,
    progress=False,
) -> QuantError:
    """Quantize a copy of ``model`` with ``spec`` and compare losses on ``eval_set``.

    Args:
        model: the full-precision model (left untouched).
        spec: quantizer spec or string.
        eval_set: evaluation batches (TokenSet or iterable of [b, s] LongTensors).
        calibration: calibration batches (GPTQ; ignored by calibration-free specs); must not share
            sequences with ``eval_set`` (checked, :class:`CalibrationError`).
        modules: linear-layer globs (default: every Linear in the decoder blocks).
        fp_loss: the model's loss on ``eval_set`` if already known (float or LossResult), to save
            one evaluation when sweeping several specs.
        progress: layers and batches done / planned on stderr (True, or a
            :data:`losslens.geometry.base.progress.ProgressArg`).

    Cost: one evaluation of the quantized model (+1 of the FP model without ``fp_loss``) plus the
    quantization itself (see :func:`losslens.lm.quant.quantize`). Peak memory: two models.
    """
    t0 = time.perf_counter()
    spec = QuantSpec.parse(spec)
    eval_batches = list(eval_set)
    if calibration is not None and spec.needs_calibration:
        check_disjoint(eval_batches, calibration_batches(calibration))
    if fp_loss is None:
        fp = evaluate(model, eval_batches, progress=progress, desc="FP eval").loss
    else:
        fp = float(fp_loss.loss if isinstance(fp_loss, LossResult) else fp_loss)
    qm = quantize(model, spec, calibration=calibration, modules=modules, progress=progress)
    q_res = evaluate(qm.model, eval_batches, progress=progress, desc=f"{spec} eval")
    q = q_res.loss
    mods = dict(qm.model.named_modules())
    pooled = float(weight_kurtosis(qm.model, {n: mods[n] for n in qm.names}).pooled)
    out = QuantError(
        spec=str(spec),
        fp_loss=fp,
        q_loss=q,
        rel_loss_error=q / fp - 1.0,
        ppl_gap=math.expm1(q - fp),
        fp_ppl=math.exp(fp),
        q_ppl=math.exp(q),
        layer_errors=qm.layer_errors,
        kurtosis=pooled,
        seconds=time.perf_counter() - t0,
        n_tokens=q_res.n_tokens,
        quant_seconds=qm.seconds,
        notes=tuple(qm.notes()),
        calib_objective_ratio=qm.calib_objective_ratio,
    )
    del qm
    return out
