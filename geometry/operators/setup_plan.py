"""The memory of an operator's set-up, planned before it runs (issue #36: measure inside the budget).

Before any estimator plans, a Hessian operator's set-up measures things by running them: the
second-order check (:func:`losslens.lm.models.second_order.ensure_second_order`: a float64 copy of the
model, or a miniature), the double-backward graph of one row of each batch shape
(:func:`losslens.geometry.operators.reverse.graph_bytes`), the difference backend's error check. Each holds
at least one gradient of every selected parameter, so a run whose budget is far below that used to
allocate it all before its refusal (9.1× a 60 MB budget on a 56.6M model). This module plans them
first, from what is known without running anything:

- :func:`setup_floor`: the least bytes any estimator on the operator holds beyond the model — one
  product of one vector (every backend holds at least two gradients' worth of the selected
  parameters in their dtype: the gradient with its graph and the second backward's result; the
  difference backend's kept θ and its gradient) plus three vectors in the vector dtype, plus the
  loss's own temporaries. Every estimator's smallest plan is at least this, so refusing when it
  exceeds the budget never refuses a run that would have been accepted;
- :func:`plan_setup`: that refusal (:class:`~losslens.geometry.memory.budget.MemoryBudgetError`, one line:
  the bytes needed and available, what to change: :func:`refusal`), then the two below in order of
  cost: the graph floor and the caller's sizing of the second-order check
  (:func:`losslens.lm.models.lm_setup.plan_lm_setup` passes
  :func:`losslens.lm.models.miniature.check_precision`);
- :func:`check_graph_floor`: before the one-row graph of a long row is measured, the graph is
  measured on two short prefixes of that row (:data:`PREFIX` and 2 × :data:`PREFIX` tokens: one
  gradient and a few tokens of activations each) and extrapolated to a lower bound of the whole
  batch's graph (saved bytes are convex in the tokens: linear parts, attention's quadratic part);
  when the smallest reverse pass with that lower bound exceeds the budget the run is refused before
  the full measurement.

Nothing here changes what an accepted run measures or computes: the floors are lower bounds of the
plans the estimators make anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from losslens.geometry.memory.graphs import pass_bytes, saved_graph_bytes
from losslens.geometry.memory.budget import MemoryBudgetError, format_bytes, resolve_budget

__all__ = ["SetupPlan", "setup_floor", "plan_setup", "check_graph_floor", "refusal", "PREFIX"]

#: Tokens of the shorter prefix whose graph bounds a long row's from below.
PREFIX = 16
#: Vectors the smallest estimator holds (as ``backend="auto"`` prices it).
STATE_VECTORS = 3


@dataclass(frozen=True)
class SetupPlan:
    """What :func:`plan_setup` found: ``budget`` (bytes, None when the caller gave none), ``floor``
    (bytes of :func:`setup_floor`, which fits the budget), ``check``: what the caller's second-order
    check sizing returned (its precision; None without a budget or a check) and ``check_refused``: an
    optional check did not fit."""

    budget: int | None
    floor: int
    check: str | None = None
    check_refused: bool = False


def setup_floor(dim: int, param_dtype: torch.dtype, vector_dtype: torch.dtype, transient: int = 0) -> int:
    """Least bytes any estimator on an operator of ``dim`` selected numbers holds beyond the model:
    two gradients in ``param_dtype``, the loss's temporaries ``transient`` and ``STATE_VECTORS``
    vectors in ``vector_dtype``."""
    return int(2 * dim * param_dtype.itemsize + transient + STATE_VECTORS * dim * vector_dtype.itemsize)


def refusal(what: str, need: int, budget: int, why: str) -> MemoryBudgetError:
    """The one-line refusal of a set-up step: ``what`` needs ``need`` bytes (``why``) of ``budget``."""
    return MemoryBudgetError(
        f"{what} needs at least {format_bytes(need)} but max_memory is {format_bytes(budget)} ({why}); "
        "raise max_memory, select fewer parameters (params=...) or load the model in a smaller dtype"
    )


def plan_setup(
    model: torch.nn.Module,
    dim: int,
    param_dtype: torch.dtype,
    vector_dtype: torch.dtype,
    max_memory: Any,
    transient: int = 0,
    graph_probe: Any = None,
    check: Any = None,
    check_optional: bool = False,
) -> SetupPlan:
    """Plan an operator's set-up on ``model`` for ``dim`` selected numbers before anything runs, refusing
    in the order of cost: :func:`setup_floor` over ``max_memory`` (arithmetic); with ``graph_probe``
    (a reverse-backend operator of the run's loss and batches) :func:`check_graph_floor` (two gradients
    of one short row); with ``check`` (``check(budget) -> precision``: the caller's second-order check
    sizing, raising :class:`~losslens.geometry.memory.budget.MemoryBudgetError` when it cannot fit; run
    only when the steps before fit) its answer, recorded as ``check`` (``check_refused``, not raised,
    when ``check_optional``). ``max_memory=None``: nothing is refused and nothing measured, the set-up is as
    before (estimators may still be given their own budget). Returns a :class:`SetupPlan`."""
    floor = setup_floor(dim, param_dtype, vector_dtype, transient)
    if max_memory is None:
        return SetupPlan(None, floor)
    device = next(model.parameters()).device
    budget = resolve_budget(max_memory, device)
    if floor > budget:
        raise refusal(
            "the curvature operator",
            floor,
            budget,
            f"one product of one vector: two gradients of {dim} parameters in "
            f"{str(param_dtype).replace('torch.', '')} and {STATE_VECTORS} vectors, planned before any "
            "measurement",
        )
    plan = SetupPlan(budget, floor)
    if graph_probe is not None:
        check_graph_floor(graph_probe, plan)
    if check is None:
        return plan
    try:
        return SetupPlan(budget, floor, check(budget))
    except MemoryBudgetError:
        if not check_optional:
            raise
        return SetupPlan(budget, floor, None, check_refused=True)


def check_graph_floor(op: Any, plan: SetupPlan) -> None:
    """Refuse, before the one-row graph of a long batch is measured, when a lower bound of the
    reverse backend's smallest pass (one vector, no cache) plus ``STATE_VECTORS`` vectors exceeds
    ``plan.budget``. The lower bound: the saved graph of one row measured on :data:`PREFIX` and
    2 × :data:`PREFIX` tokens, extended linearly with the slope between them to the row's tokens,
    times the rows. Only ``[rows, tokens]`` tensor batches longer than 2 × :data:`PREFIX` are
    checked (others are measured whole, as before). Cost: two gradients with graph of one short row."""
    from losslens.geometry.operators.reverse import ReverseBackend, converted_bytes

    if plan.budget is None or not op.product_backend.keeps_graphs or not op.batches:
        return
    batch = max(op.batches, key=lambda b: b.numel() if isinstance(b, torch.Tensor) else 0)
    if not isinstance(batch, torch.Tensor) or batch.ndim != 2 or batch.shape[1] <= 2 * PREFIX:
        return
    rows, tokens = batch.shape
    index = next(i for i, b in enumerate(op.batches) if b is batch)
    grad = op.dim * op.param_dtype.itemsize  # the pass's parts that need no measurement
    transient = op.loss_transient_bytes + converted_bytes(op, 1, 1, False)
    saved = []
    with op.call_context(ReverseBackend()) as params:
        for t in (PREFIX, 2 * PREFIX):
            prefix = batch[:1, :t].clone()

            def build() -> None:
                loss = op.batch_loss(params, prefix, index)
                torch.autograd.grad(loss, list(params.values()), create_graph=True, allow_unused=True)

            saved.append(saved_graph_bytes(op.model, build))
    slope = max(0, saved[1] - saved[0]) / PREFIX
    row = saved[1] + slope * (tokens - 2 * PREFIX)
    need = pass_bytes([int(rows * row) + grad], grad, False, 1, 1, False, transient)
    need += STATE_VECTORS * op.dim * op.dtype.itemsize
    if need > plan.budget:
        raise refusal(
            "the curvature operator's smallest pass",
            need,
            plan.budget,
            f"one vector on the double-backward graph of {rows} × {tokens} tokens, bounded from below on "
            f"one row's first {2 * PREFIX} tokens before measuring the whole row",
        )
