"""The set-up of :func:`probes.models.curvature.lm_hessian`, planned inside its memory budget (issue #36).

:func:`plan_lm_setup` runs first, before anything is measured, and refuses
(:class:`~geometry.memory.model.MemoryBudgetError`, one line) when a measuring step cannot fit
``max_memory``, in the order of their cost:

1. the smallest product any estimator makes (:func:`geometry.operators.setup_plan.plan_setup`:
   two gradients and three vectors, arithmetic only);
2. with the reverse backend, the smallest pass on a lower bound of the batches' graph measured on a
   short prefix of one row (:func:`geometry.operators.setup_plan.check_graph_floor`);
3. the second-order check (:func:`probes.models.second_order.ensure_second_order`): on a float64
   copy when :data:`CHECK_FACTOR` × 8 bytes × the model's parameters fits, else on the float64
   miniature (:func:`probes.models.miniature.miniature`) when that many bytes of its parameters fit,
   else refused (``backend="auto"``: ``"unchecked"``, the check is skipped and the choice made
   without it; :func:`~probes.models.curvature.lm_hessian` refuses if the exact backend is chosen).

With ``max_memory=None`` nothing is refused and the check chooses as before (an estimator may be
given its own budget later). An accepted run measures and computes what it did before.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from geometry.base.params import ParamSpace, select_parameters
from geometry.memory.model import MemoryBudgetError, format_bytes
from geometry.operators.auto import AutoBackend
from geometry.operators.hessian import HessianOperator
from geometry.operators.interface import estimator_dtype
from geometry.operators.setup_plan import check_graph_floor, plan_setup, refusal

__all__ = ["plan_lm_setup", "CHECK_FACTOR", "UNCHECKED"]

#: The check precision of a ``backend="auto"`` operator whose second-order check cannot fit.
UNCHECKED = "unchecked"

#: Peak resident memory of the second-order check (2 × 16 tokens) in multiples of the float64
#: parameters it runs on (8 bytes each): measured 18.2 on a float64 copy of the Pythia 14M shape and
#: 27.4 on its miniature (3.25M parameters, the 50,304-token vocabulary kept, whose logits dominate),
#: float32 model, glibc's defaults (benchmarks/README.md, "Refusals"). Validated on that shape only.
CHECK_FACTOR = 28


def plan_lm_setup(
    model: nn.Module,
    batches: Sequence[torch.Tensor],
    params: Any,
    exact_backend: Any,
    runs_check: bool,
    loss_fn: Any,
    transient: int,
    kwargs: dict,
) -> str:
    """Plan :func:`~probes.models.curvature.lm_hessian`'s set-up; returns the second-order check's
    ``precision`` (``"auto"`` or ``"miniature"``; ``"unchecked"`` with ``backend="auto"`` when the
    check cannot fit). ``exact_backend``: the backend the check is for
    (a reverse one gets the graph bound); ``runs_check``: the check will run; ``loss_fn``: the
    operator's loss with the head ``lm_hessian`` was asked for (``lean_head``), ``transient``: its
    temporaries (bytes: the lean head's chunks, 0 for the plain loss); ``kwargs``: the operator's
    keyword arguments.
    Raises :class:`~geometry.memory.model.MemoryBudgetError` before any measurement that cannot fit.
    Cost: arithmetic, plus with the reverse backend two gradients of one short row."""
    from geometry.operators.reverse import ReverseBackend

    space = ParamSpace.from_params(select_parameters(model, params))
    plan = plan_setup(model, space.dim, space.dtype, estimator_dtype(space.dtype), kwargs.get("max_memory"))
    if plan.budget is None:
        return "auto"
    if isinstance(exact_backend, ReverseBackend) and batches and kwargs.get("data_parallel") is None:
        probe = HessianOperator(model, loss_fn, batches, params=params, loss_transient_bytes=transient)
        check_graph_floor(probe, plan)
    if not runs_check:
        return "auto"
    try:
        return _check_precision(model, plan.budget)
    except MemoryBudgetError:
        if isinstance(exact_backend, AutoBackend):
            return UNCHECKED
        raise


def _check_precision(model: nn.Module, budget: int) -> str:
    """``"auto"`` when the check's float64 copy (or the model itself, already float64) fits, else
    ``"miniature"`` when the miniature's check fits; else :class:`MemoryBudgetError`."""
    from .miniature import miniature

    n = sum(p.numel() for p in model.parameters())
    dtype = next(model.parameters()).dtype
    copy_is_auto = n < 50_000_000 and dtype not in (torch.float16, torch.bfloat16)  # working_model's rule
    if copy_is_auto and CHECK_FACTOR * 8 * n <= budget:
        return "auto"
    mini = miniature(model)
    if mini is None:  # no miniature: the check runs on the model itself, as before (not bounded here)
        return "auto"
    need = CHECK_FACTOR * 8 * sum(p.numel() for p in mini.parameters())
    del mini
    if need > budget:
        raise refusal(
            "the second-order check",
            int(need),
            budget,
            f"{CHECK_FACTOR} × its float64 miniature's parameters; the float64 copy would need "
            f"{format_bytes(CHECK_FACTOR * 8 * n)}",
        )
    return "miniature"
