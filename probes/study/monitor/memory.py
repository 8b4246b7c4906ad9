"""Will a measurement fit beside training? :func:`check_memory` answers before training starts.

A measurement holds, beyond the model and optimizer already resident, at most the larger of

* the quantization phase: one deep copy of the model (weights, buffers and any ``.grad``) plus one
  no-grad forward of an eval batch (activations, logits, loss temporaries; measured once with
  :func:`losslens.geometry.memory.graphs.peak_new_bytes` on the first eval batch);
* the curvature phase: the memory plans of the Hutchinson trace and of Lanczos
  (:func:`losslens.geometry.estimators.trace.estimate_memory`,
  :func:`losslens.geometry.estimators.eigen.estimate_memory`:
  their vectors plus one double-backward pass on the curvature set).

Against ``settings.max_memory`` or, when None, :func:`losslens.geometry.memory.budget.default_budget` of the
model's device (a fraction of what is free now). Training's own peak is not known here: on a GPU,
call ``prepare`` after the first optimizer step (when the optimizer state exists) for a budget that
already excludes it, or give ``max_memory``.
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from losslens.geometry.memory.budget import MemoryBudgetError, format_bytes, resolve_budget

from losslens.study.monitor.settings import MonitorMemoryError, MonitorSettings

__all__ = ["check_memory"]


def _model_bytes(model: nn.Module) -> int:
    n = 0
    for p in model.parameters():
        n += p.numel() * p.element_size()
        if p.grad is not None:
            n += p.grad.numel() * p.grad.element_size()
    for b in model.buffers():
        n += b.numel() * b.element_size()
    return int(n)


def check_memory(model: nn.Module, settings: MonitorSettings, token_sets: Mapping) -> dict:
    """The monitor's memory plan (bytes per phase, the budget); raises
    :class:`~losslens.study.monitor.settings.MonitorMemoryError` when a phase does not fit. Cost: one
    instrumented forward of an eval batch; with curvature, building the Hessian operator (and the
    once-per-architecture second-order check, :func:`losslens.lm.models.curvature.lm_hessian`)."""
    from losslens.geometry.memory.graphs import peak_new_bytes
    from losslens.lm.core.next_token_loss import lm_loss

    params = list(model.parameters())
    if not params:
        raise MonitorMemoryError("the model has no parameters: nothing to monitor")
    device = params[0].device
    try:
        budget = resolve_budget(settings.max_memory, device)
    except MemoryBudgetError as exc:
        raise MonitorMemoryError(str(exc)) from exc
    batch = token_sets["eval"][0]
    with torch.no_grad():
        _, fwd = peak_new_bytes(lambda: lm_loss(model, batch))
    copy = _model_bytes(model)
    plan = {
        "budget": budget,
        "device": str(device),
        "quantization": {"model_copy": copy, "eval_forward": int(fwd), "total": copy + int(fwd)},
    }
    need = copy + int(fwd)
    if settings.curvature:
        from losslens.geometry.estimators.eigen import estimate_memory as eigen_memory
        from losslens.geometry.estimators.trace import estimate_memory as trace_memory
        from losslens.lm.models.curvature import lm_hessian

        try:  # the operator's set-up is planned first (it refuses a budget its floor exceeds)
            op = lm_hessian(model, list(token_sets["curvature"]), params=settings.curvature_params, max_memory=budget)
            tr = trace_memory(op, "hutchinson", settings.trace_hvps, max_memory=budget)
            ei = eigen_memory(op, 1, "lanczos", settings.lanczos_steps, max_memory=budget)
        except MemoryBudgetError as exc:
            raise MonitorMemoryError(
                f"the monitor's curvature estimate does not fit beside training: {exc}; lower "
                "trace_hvps / lanczos_steps, use a smaller curvature_set, set curvature=False, "
                "or raise max_memory"
            ) from exc
        plan["trace"], plan["eigen"] = tr.to_dict(), ei.to_dict()
        need = max(need, tr.total, ei.total)
    plan["need"] = int(need)
    if need > budget:
        q = plan["quantization"]
        raise MonitorMemoryError(
            f"the monitor needs {format_bytes(need)} beside training (quantization: model copy "
            f"{format_bytes(q['model_copy'])} + eval forward {format_bytes(q['eval_forward'])}) but only "
            f"{format_bytes(budget)} is available on {device}; "
            "use a smaller eval_set batch, fewer specs, or raise max_memory. Refused before training starts."
        )
    return plan
