"""The quantization error of one checkpoint under several quantizer specs (``losslens quantize``).

For every spec: quantize a copy of the checkpoint, evaluate it on the evaluation set and report FP
loss, quantized loss, ΔQ L = L̂/L − 1 and ΔQ PPL = exp(L̂ − L) − 1 (docs/science.md §2), one row per
spec. Data: the checkpoint's own tokenizer and :func:`losslens.lm.data.default_token_sets` (held-out
embedded corpus; disjoint eval and calibration sets), or token sets saved with
:meth:`losslens.lm.core.tokenset.TokenSet.save`. Imports torch only when called.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from losslens.geometry.base.errors import LosslensError
from losslens.lm.shared_settings import keywords, settings

DEFAULT_SPECS = ("int8", "rtn:4:g128", "rtn:3:g128", "gptq:4:g128")
"""The specs measured when none is given."""


class QuantizeCheckpointError(LosslensError, ValueError):
    """A spec, checkpoint or token set ``losslens quantize`` cannot use; the message names which."""


@settings
@dataclass(frozen=True)
class QuantizeSettings:
    """What ``losslens quantize`` measures: the specs (None: :data:`DEFAULT_SPECS`), the token sets
    (``eval_set`` / ``calib_set`` files, else the default sets, small with ``quick``; only their first
    ``eval_batches`` / ``calib_batches``), the linears quantized (``modules`` globs; None: every Linear
    in the blocks), no progress lines on stderr (``quiet``), and the checkpoint's label, hub cache, device
    (None: cpu) and pickle permission."""

    spec: Optional[list[str]] = None
    calib_batches: Optional[int] = None
    eval_batches: Optional[int] = None
    eval_set: Optional[Path] = None
    calib_set: Optional[Path] = None
    quick: bool = False
    modules: Optional[list[str]] = None
    device: Optional[str] = None
    quiet: bool = False
    allow_pickle: bool = False
    label: Optional[str] = None
    cache_dir: Optional[Path] = None


def quantize_checkpoint(checkpoint: str | Path, settings: QuantizeSettings = QuantizeSettings()) -> list[dict]:
    """One JSON-ready row per spec (what ``losslens quantize --json`` prints, one line each): ``spec``,
    ``fp_loss``, ``q_loss``, ``rel_loss_error`` (ΔQ L), ``ppl_gap`` (ΔQ PPL), ``mean_rel_weight_error``,
    ``kurtosis``, ``n_layers``, ``n_tokens``, the token sets' hashes, AWQ's ``calib_objective_ratio``,
    ``quant_seconds`` / ``seconds`` (wall time) and ``notes``. Raises :class:`QuantizeCheckpointError`
    for a bad spec, a checkpoint that cannot be loaded or token sets that cannot be built or read.
    Cost: one evaluation of the FP model plus, per spec, one quantization and one evaluation."""
    from losslens.lm.checkpoints import CheckpointError, CheckpointLoader, open_checkpoint
    from losslens.lm.core.next_token_loss import evaluate
    from losslens.lm.core.tokenset import TokenSet, TokenSetError
    from losslens.lm.quant import QuantizeError, QuantSpec, quantization_error

    s = settings
    try:
        specs = [QuantSpec.parse(x) for x in (s.spec or DEFAULT_SPECS)]
    except QuantizeError as e:
        raise QuantizeCheckpointError(f"--spec: {e}") from None
    try:
        traj, ref = open_checkpoint(checkpoint, s.label, cache_dir=s.cache_dir, alone=True)
        model = CheckpointLoader(traj, device=s.device, allow_pickle=s.allow_pickle).load(ref)
    except (CheckpointError, OSError, ValueError) as e:
        raise QuantizeCheckpointError(f"cannot load {checkpoint}: {e}") from None
    model.eval()
    try:
        sets = {}
        if s.eval_set is None or (s.calib_set is None and any(x.needs_calibration for x in specs)):
            from losslens.lm.data import default_token_sets

            sets = default_token_sets(traj, quick=s.quick)
        ev = TokenSet.load(s.eval_set) if s.eval_set else sets["eval"]
        cal = TokenSet.load(s.calib_set) if s.calib_set else sets.get("calibration")
        if s.eval_batches:
            ev = ev.subset(s.eval_batches)
        if s.calib_batches and cal is not None:
            cal = cal.subset(s.calib_batches)
    except (TokenSetError, OSError, ValueError) as e:
        raise QuantizeCheckpointError(f"cannot build or read the token sets: {e}") from None
    fp = evaluate(model, ev, progress=not s.quiet)
    rows = []
    for q in specs:
        try:
            err = quantization_error(
                model,
                q,
                ev,
                calibration=cal if q.needs_calibration else None,
                modules=s.modules or None,
                fp_loss=fp,
                progress=not s.quiet,
            )
        except QuantizeError as e:
            raise QuantizeCheckpointError(f"{q}: {e}") from None
        errs = list(err.layer_errors.values())
        rows.append(
            {
                "checkpoint": str(checkpoint),
                "label": ref.label,
                "step": ref.step,
                "spec": err.spec,
                "fp_loss": err.fp_loss,
                "q_loss": err.q_loss,
                "rel_loss_error": err.rel_loss_error,
                "ppl_gap": err.ppl_gap,
                "fp_ppl": err.fp_ppl,
                "q_ppl": err.q_ppl,
                "mean_rel_weight_error": sum(errs) / len(errs) if errs else math.nan,
                "kurtosis": err.kurtosis,
                "n_layers": len(errs),
                "n_tokens": err.n_tokens,
                "eval_hash": ev.content_hash,
                "calib_hash": cal.content_hash if (cal is not None and q.needs_calibration) else None,
                "calib_objective_ratio": err.calib_objective_ratio,
                "quant_seconds": err.quant_seconds,
                "seconds": err.seconds,
                "notes": list(err.notes),
            }
        )
    return rows


quantize = keywords(
    quantize_checkpoint,
    "quantize",
    """``quantize(checkpoint, *, spec=None, quick=False, eval_batches=None, ...)``: :func:`quantize_checkpoint`
    with :class:`QuantizeSettings`' fields as keyword parameters (named like ``losslens quantize``'s options,
    with their defaults). ``checkpoint``: a checkpoint folder or weight file, a trajectory folder (``label``)
    or ``hf:ORG/NAME@REV``. Returns one row per spec, the rows ``losslens quantize --json`` prints.""",
)

__all__ = ["DEFAULT_SPECS", "QuantizeCheckpointError", "QuantizeSettings", "quantize", "quantize_checkpoint"]
