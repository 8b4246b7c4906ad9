"""Tasks: one stored row key ``(probe, spec)`` of a checkpoint and the settings that produce it.

:func:`make_task` hashes exactly those settings into the task's ``config_hash``, so a resumed
store reuses a row only when it was computed the same way; :func:`curvature_options` and
:func:`quant_options` are the plan's shared settings that curvature and quantization probes add.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    """One stored row key of a checkpoint: ``probe`` and ``spec`` plus the settings that produce it.

    ``spec`` is the quantizer spec for quant/directional, the trace method for trace, ``"top{k}"``
    for eigen, the groups' name for block_trace (the tidy results expand it into one row per group)
    and ``""`` for loss and kurtosis. ``curvature``: the probe measures on the curvature set.
    """

    probe: str
    spec: str
    options: tuple[tuple[str, Any], ...] = ()
    config_hash: str = ""
    curvature: bool = field(default=False, compare=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.probe, self.spec)

    @property
    def opts(self) -> dict:
        return dict(self.options)


def make_task(probe: str, spec: str, options: dict, curvature: bool = False) -> Task:
    """The :class:`Task` of ``(probe, spec)`` with ``options`` (JSON-able), hashed into ``config_hash``
    (the first 16 hex digits of the SHA-256 of their canonical JSON)."""
    blob = json.dumps({"probe": probe, "spec": spec, **options}, sort_keys=True, separators=(",", ":"), default=str)
    return Task(
        probe,
        spec,
        tuple(sorted((k, _freeze(v)) for k, v in options.items())),
        hashlib.sha256(blob.encode()).hexdigest()[:16],
        curvature,
    )


def curvature_options(plan) -> dict:
    """The plan's settings every curvature probe depends on (parameters, curvature set, memory, backend,
    compute dtype)."""
    from losslens.geometry.operators.names import is_default_backend  # lazily: plans are read without torch

    return {
        "curvature_params": list(plan.curvature_params) if plan.curvature_params else None,
        "data": list(plan.data.curvature),
        **({"max_memory": plan.max_memory} if plan.max_memory is not None else {}),
        **({} if is_default_backend(plan.backend) else {"backend": plan.backend}),
        **({"compute_dtype": plan.compute_dtype} if plan.compute_dtype is not None else {}),
    }


def quant_options(plan) -> dict:
    """The plan's settings every quantization probe depends on (modules, eval and calibration sets)."""
    return {
        "quant_modules": list(plan.quant_modules) if plan.quant_modules else None,
        "eval": list(plan.data.eval),
        "calibration": list(plan.data.calibration),
    }


def _freeze(v):
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    return v


__all__ = ["Task", "make_task", "curvature_options", "quant_options"]
