"""Why quantizers hurt one checkpoint, from settings objects (``losslens explain``).

:func:`explain_measure` runs :func:`losslens.measure.explain.checkpoint.explain_checkpoint` with
:class:`ExplainSettings` and the shared groups; :func:`explain_payload` is its JSON form (what
``losslens explain --json`` prints and ``--out`` writes); :func:`explain` is both as one function with
the CLI's options as keyword parameters (``losslens.explain``). Imports torch only when called.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from losslens.geometry.base.errors import LosslensError
from losslens.lm.shared_settings import (
    CheckpointOptions,
    ComputeOptions,
    ErrorOptions,
    MemoryOptions,
    keywords,
    settings,
)

DEFAULT_SPECS = ("rtn:4:g128", "gptq:4:g128")
"""The specs explained when none is given."""


class ExplainSettingsError(LosslensError, ValueError):
    """A spec ``losslens explain`` cannot parse; the message names it."""


@settings
@dataclass(frozen=True)
class ExplainSettings:
    """What ``losslens explain`` measures: the specs (None: :data:`DEFAULT_SPECS`), the block partition
    (``layer``, ``kind``, ``layer_kind``, ``module``, ``parameter``) and whether δ_bᵀH_bbδ_b is taken per
    block (``within``: one HVP per block and spec), the tr H estimate (``trace_hvps`` HVPs by
    ``trace_method``), the token sets (``curvature_set`` / ``calib_set`` files, else the default sets,
    small with ``quick``), the linears quantized (``modules``), the seed, device (None: cuda when
    available), torch threads, the HVP backend and compute dtype (:class:`ComputeOptions`' defaults), and
    ``quiet``: no progress lines on stderr."""

    spec: Optional[list[str]] = None
    blocks: str = "layer"
    within: bool = False
    trace_hvps: int = 30
    trace_method: str = "hutch++"
    quick: bool = False
    curvature_set: Optional[Path] = None
    calib_set: Optional[Path] = None
    modules: Optional[list[str]] = None
    seed: int = 0
    device: Optional[str] = None
    threads: Optional[int] = None
    backend: str = ComputeOptions.backend
    compute_dtype: Optional[str] = ComputeOptions.compute_dtype
    quiet: bool = False


def explain_measure(
    checkpoint: str | Path,
    settings: ExplainSettings = ExplainSettings(),
    *,
    source: CheckpointOptions = CheckpointOptions(),
    memory: MemoryOptions = MemoryOptions(),
    errors: ErrorOptions = ErrorOptions(),
) -> dict:
    """:func:`~losslens.measure.explain.checkpoint.explain_checkpoint`'s result (``explanations`` as
    :class:`~losslens.measure.explain.explanation.Explanation` objects) for these settings. Applies
    ``memory.strict_memory`` first; raises :class:`ExplainSettingsError` for a bad spec and
    ``ExplainError`` / ``BlockError`` / ``QuantizeError`` / ``EstimatorError`` (all
    :class:`LosslensError`) from the measurement; ``errors.strict``: a flagged result raises
    ``ExplainError``. Cost: ``trace_hvps`` HVPs plus one gradient, one HVP and one loss per spec."""
    from losslens.lm.quant import QuantizeError, QuantSpec
    from losslens.measure.explain.checkpoint import explain_checkpoint
    from losslens.measure.explain.direction import ExplainError

    memory.apply()
    s = settings
    try:
        specs = [str(QuantSpec.parse(x)) for x in (s.spec or DEFAULT_SPECS)]
    except QuantizeError as e:
        raise ExplainSettingsError(f"--spec: {e}") from None
    result = explain_checkpoint(
        checkpoint,
        specs,
        label=source.label,
        blocks=s.blocks,
        within=s.within,
        trace_matvecs=s.trace_hvps,
        trace_method=s.trace_method,
        seed=s.seed,
        quick=s.quick,
        device=s.device,
        curvature_set=s.curvature_set,
        calibration_set=s.calib_set,
        modules=s.modules,
        num_threads=s.threads,
        max_memory=memory.max_memory,
        cache_dir=source.cache_dir,
        schedule=source.schedule,
        tokens_per_step=source.tokens_per_step,
        backend=s.backend,
        compute_dtype=s.compute_dtype,
        error_tolerance=errors.error_tolerance,
        progress=not s.quiet,
    )
    if errors.strict and result["error_warning"]:
        raise ExplainError(f"{result['error_warning']['message']} (strict: the result is not returned)")
    return result


def explain_payload(result: dict) -> dict:
    """The JSON-ready form of :func:`explain_measure`'s result (each explanation's ``to_dict()``; other
    values a JSON encoder cannot write as their ``str``): what ``losslens explain --json`` prints."""
    payload = {k: v for k, v in result.items() if k != "explanations"}
    payload["explanations"] = [e.to_dict() for e in result["explanations"]]
    return json.loads(json.dumps(payload, default=str))


def _explain(
    checkpoint: str | Path,
    settings: ExplainSettings = ExplainSettings(),
    *,
    source: CheckpointOptions = CheckpointOptions(),
    memory: MemoryOptions = MemoryOptions(),
    errors: ErrorOptions = ErrorOptions(),
) -> dict:
    return explain_payload(explain_measure(checkpoint, settings, source=source, memory=memory, errors=errors))


explain = keywords(
    _explain,
    "explain",
    """``explain(checkpoint, *, spec=None, blocks="layer", within=False, trace_hvps=30, ...)``: the
    second-order explanation of ``checkpoint``'s quantization error under each spec, as the JSON object
    ``losslens explain --json`` prints (:func:`explain_payload` of :func:`explain_measure`); keyword
    parameters named like the CLI's options, with their defaults. ``checkpoint``: a checkpoint folder,
    a trajectory folder (``label``) or ``hf:ORG/NAME@REV``. ``--out`` (the file the CLI writes) is the
    CLI's alone.""",
)

__all__ = [
    "DEFAULT_SPECS",
    "ExplainSettings",
    "ExplainSettingsError",
    "explain",
    "explain_measure",
    "explain_payload",
]
