"""Explain one checkpoint on disk (``losslens explain CKPT --spec ...``).

Data: the checkpoint's own tokenizer and :func:`losslens.lm.data.default_token_sets` (held-out embedded
corpus; curvature and calibration sets disjoint from the eval set), or saved
:class:`~losslens.lm.core.tokenset.TokenSet` files. ΔL, g and H are all taken on the curvature set, so
the second-order identity ΔL = gᵀδ + ½δᵀHδ + remainder holds on one set of batches.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from losslens.geometry.operators.names import DEFAULT_BACKEND
from losslens.measure.explain.explanation import explain_specs, product_warning, worst_check
from losslens.measure.explain.direction import ExplainError


def explain_checkpoint(
    checkpoint: str | Path,
    specs: Sequence[str],
    label: str | None = None,
    blocks: str = "layer",
    within: bool = False,
    trace_matvecs: int = 30,
    trace_method: str = "hutch++",
    seed: int = 0,
    quick: bool = False,
    device=None,
    curvature_set: str | Path | None = None,
    calibration_set: str | Path | None = None,
    modules: Sequence[str] | None = None,
    num_threads: int | None = None,
    max_memory: int | str | None = None,
    cache_dir: str | Path | None = None,
    schedule: str | None = None,
    tokens_per_step: int | None = None,
    backend: str = DEFAULT_BACKEND,
    compute_dtype: str | None = None,
    error_tolerance: float = 1e-2,
    progress: bool = False,
) -> dict:
    """Explanations of ``specs`` on one checkpoint, as ``{"checkpoint", "step", "lr", "data", "explanations"
    (list of :class:`~losslens.measure.explain.explanation.Explanation`), "seconds", "device", "hvp_check",
    "error_warning"}``:
    ``hvp_check`` is the largest measured product error of all explanations (None: exact backend) and
    ``error_warning`` is set when it is over ``error_tolerance`` (error, cause, fix, message).

    ``checkpoint``: a checkpoint folder, a trajectory folder (``label`` picks one; default the last
    real checkpoint) or a hub name ``hf:ORG/NAME@REV``, opened by
    :func:`losslens.lm.checkpoints.open_checkpoint` with ``cache_dir``, ``schedule`` and ``tokens_per_step``
    (the step / LR / tokens reported). Other arguments as :func:`~losslens.measure.explain.explanation.explain_specs`;
    ``quick``
    uses the small default token sets; ``num_threads`` sets torch's threads for the call;
    ``max_memory`` (bytes or ``"8GB"``) bounds each curvature estimator; ``backend`` picks the HVP backend and
    ``compute_dtype`` the dtype its products run in (None: float32 for half-precision weights).
    """
    from losslens.lm.checkpoints import CheckpointError, CheckpointLoader, open_checkpoint
    from losslens.lm.core.threads import torch_threads
    from losslens.lm.core.tokenset import TokenSet

    from losslens.geometry.operators.names import BACKENDS

    if backend not in BACKENDS:
        raise ExplainError(f"backend {backend!r} is unknown; valid: {', '.join(BACKENDS)}")
    from losslens.geometry.operators.precision import COMPUTE_DTYPES

    if compute_dtype is not None and compute_dtype not in COMPUTE_DTYPES:
        raise ExplainError(f"compute dtype {compute_dtype!r} is unknown; valid: {', '.join(COMPUTE_DTYPES)}")
    try:
        traj, ref = open_checkpoint(
            checkpoint, label, cache_dir=cache_dir, schedule=schedule, tokens_per_step=tokens_per_step, alone=True
        )
    except CheckpointError as exc:
        raise ExplainError(str(exc)) from exc
    from losslens.lm.quant import QuantSpec

    t0 = time.perf_counter()
    needs_calib = any(QuantSpec.parse(s).needs_calibration for s in specs)
    sets = {}
    try:
        if curvature_set is None or (calibration_set is None and needs_calib):
            from losslens.lm.data import default_token_sets

            sets = default_token_sets(traj, quick=quick, seed=seed)
        curv = TokenSet.load(curvature_set) if curvature_set is not None else sets["curvature"]
        calib = TokenSet.load(calibration_set) if calibration_set is not None else sets.get("calibration")
    except (ValueError, OSError) as exc:  # DataError, TokenSetError, unreadable files
        raise ExplainError(
            f"cannot build or read the token sets: {exc}; pass --curvature-set / --calib-set files"
        ) from exc
    import torch

    dev = device or ("cuda" if torch.cuda.is_available() else None)
    try:
        model = CheckpointLoader(traj, device=dev).load(ref)
    except CheckpointError as exc:
        raise ExplainError(f"cannot load {ref.label!r}: {exc}") from exc
    with torch_threads(num_threads):
        exps = explain_specs(
            model,
            specs,
            curv,
            calibration=calib,
            modules=list(modules) if modules else None,
            blocks=blocks,
            within=within,
            trace_matvecs=trace_matvecs,
            trace_method=trace_method,
            seed=seed,
            max_memory=max_memory,
            backend=backend,
            compute_dtype=compute_dtype,
            error_tolerance=error_tolerance,
            progress=progress,
        )
    check = worst_check([e.hvp_check for e in exps])
    return {
        "checkpoint": ref.label,
        "step": ref.step,
        "lr": ref.lr,
        "tokens": ref.tokens,
        "location": ref.location,
        "data": {
            "curvature": {"shape": list(curv.tokens.shape), "content_hash": curv.content_hash},
            "calibration": None
            if calib is None
            else {"shape": list(calib.tokens.shape), "content_hash": calib.content_hash},
        },
        "explanations": exps,
        "seconds": time.perf_counter() - t0,
        "device": str(next(model.parameters()).device),
        "hvp_check": check,
        "error_warning": product_warning(check, error_tolerance),
    }


__all__ = ["explain_checkpoint"]
