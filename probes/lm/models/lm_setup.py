"""The curvature set-up of a language model, settled once before anything is measured.

:func:`plan_lm_setup` decides, in one place, what every LM curvature operator of a run is built
from — the one-process operator (:func:`losslens.lm.models.curvature.lm_hessian`) and the FSDP2
one (:func:`losslens.lm.models.sharding.fsdp_lm_hessian`) alike:

- the parameter selection and the compute dtype (:func:`losslens.geometry.operators.precision.compute_dtype_for`:
  float32 for half-precision weights unless asked otherwise), by the rules of the operator itself: they
  are read off the reverse operator of the run's loss built here (no product runs on it), on which the
  graph floor below is measured;
- the zero-embedding tokens left out of every loss, found once
  (:mod:`losslens.lm.models.zero_embeddings`), and the losses without them: the exact loss (what the
  second-order check differentiates), the lean head's (:func:`losslens.lm.core.lm_head.lm_loss_lean`)
  and the gradient differences' (the exact loss; products in float64 keep HF's float32 islands in
  float64: :class:`losslens.lm.models.fidelity.FidelityLoss`);
- the lean head's chunk temporaries;
- the memory plan of the set-up's measuring steps, refused before they run when they cannot fit
  ``max_memory``, in the order of their cost (:mod:`losslens.geometry.operators.setup_plan`):
  the smallest product (arithmetic), the graph floor of the reverse backend (two gradients of one
  short row, on a reverse operator of the run's loss and batches), the second-order check
  (:func:`losslens.lm.models.miniature.check_precision`: a float64 copy or a float64 miniature);
- the float64 miniature of the architecture, built at most once per set-up
  (:meth:`LmSetup.miniature`), which the second-order check and the difference backend's error bound
  both use; with ``bound=True`` (the FSDP2 path) that bound is made here.

Cost: one pass over the input embedding and arithmetic; with the reverse backend and a budget,
two gradients of one short row; a miniature (10⁴–10⁶ parameters) only when a check needs one.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import nn

from losslens.geometry.operators.auto import AutoBackend
from losslens.geometry.operators.data_parallel import DataParallel
from losslens.geometry.operators.hessian import HessianOperator
from losslens.geometry.operators.interface import estimator_dtype
from losslens.geometry.operators.names import DEFAULT_BACKEND, backend_named
from losslens.geometry.operators.reverse import ReverseBackend
from losslens.geometry.operators.setup_plan import plan_setup
from losslens.lm.core.lm_head import head_transient_bytes, lm_loss_lean
from losslens.lm.core.next_token_loss import lm_loss
from losslens.lm.models.fidelity import FidelityLoss
from losslens.lm.models.miniature import check_precision, miniature, miniature_bound
from losslens.lm.models.zero_embeddings import curvature_loss, exclusion_record, zero_embedding_tokens

__all__ = ["LmSetup", "plan_lm_setup", "UNCHECKED"]

#: The check precision of a ``backend="auto"`` operator whose second-order check cannot fit.
UNCHECKED = "unchecked"


@dataclass
class LmSetup:
    """What :func:`plan_lm_setup` settles for ``model``'s operator on ``batches`` w.r.t. ``params``:
    ``backend`` (the backend object asked for, with the error check's slice when inexact),
    ``runs_check`` (the second-order check will run), ``lean_head`` (the loss may go through the lean
    head), ``compute_dtype`` (the products' dtype), ``exclude`` (the zero-embedding token ids left out
    of every loss) and ``excluded`` (what results record about them, summed over the ranks),
    ``exact_loss`` (the loss without them), ``lean_loss`` (through the lean head when asked for, else
    ``exact_loss``), ``difference_loss`` (``exact_loss`` under float64 fidelity when the products run in
    float64: what an inexact or ``auto`` backend differences, one process or sharded), ``head_bytes`` (the lean
    head's chunk temporaries, 0 without it), ``budget`` (bytes; None: nothing is refused) and
    ``precision`` (the second-order check's: ``"auto"``, ``"miniature"`` or :data:`UNCHECKED`);
    ``bound``: with ``bound=True``, the difference backend's error bounded on the miniature
    (:func:`losslens.lm.models.miniature.miniature_bound`: ``{"rel_error", "reference"}``)."""

    model: nn.Module
    batches: list
    params: Any
    backend: Any
    runs_check: bool
    lean_head: bool
    compute_dtype: torch.dtype
    exclude: tuple[int, ...]
    excluded: dict
    exact_loss: Any
    lean_loss: Any
    difference_loss: Any
    head_bytes: int
    budget: int | None
    precision: str = "auto"
    bound: dict | None = None
    _miniature: Any = field(default=None, repr=False)

    def miniature(self) -> nn.Module | None:
        """A fresh float64 copy of the architecture's miniature (:func:`losslens.lm.models.miniature.miniature`),
        the miniature itself built once per set-up; None when none can be built. Each caller gets
        its own copy (the second-order check writes into its working model)."""
        if self._miniature is None:
            self._miniature = miniature(self.model) or False
        return None if self._miniature is False else copy.deepcopy(self._miniature)

    def bounded_error(self, batches: Sequence[torch.Tensor]) -> dict:
        """The difference backend's error where no exact product can run on the model itself, bounded on
        the set-up's miniature on ``batches`` (:func:`losslens.lm.models.miniature.miniature_bound`: the
        miniature in the model's dtype, its products in the compute dtype, against its float64 reverse
        products): ``{"rel_error", "reference"}``. Cost: 2 products of each backend on the miniature."""
        return miniature_bound(
            self.model, batches, exclude=self.exclude, compute_dtype=self.compute_dtype, build=self.miniature
        )


def plan_lm_setup(
    model: nn.Module,
    batches: Sequence[torch.Tensor],
    params: Any = None,
    backend: Any = DEFAULT_BACKEND,
    check: bool = True,
    lean_head: bool = True,
    max_memory: Any = None,
    compute_dtype: Any = None,
    loss_transient_bytes: int | None = None,
    data_parallel: Any = None,
    bound: bool = False,
) -> LmSetup:
    """Settle the set-up of ``model``'s curvature operator on ``batches`` ([b, s] token tensors) with
    respect to the ``params`` globs (module docstring). ``backend``: a name or a configured backend
    (an unknown name raises here, before any work); a reverse one has its graph floor planned, an
    ``auto`` one whose check cannot fit gets :data:`UNCHECKED` instead of a refusal. ``check``: run the
    second-order check (for backends that have one). ``lean_head``: the loss may go through the lean
    head. ``loss_transient_bytes``: the loss's temporaries when the caller knows them (default: the
    lean head's). ``data_parallel``: True, a process group or a
    :class:`~losslens.geometry.operators.data_parallel.DataParallel` (a collective: every rank plans).
    ``bound``: bound the difference backend's error on the miniature now, on a 2×32 slice of the first
    batch, the miniature in the model's dtype and its products in the compute dtype (what the sharded
    operator records: no exact product runs on it).
    Raises :class:`~losslens.geometry.memory.budget.MemoryBudgetError` (one line) before any
    measurement that cannot fit ``max_memory``."""
    batches = list(batches)
    chosen = backend_named(backend)
    auto = isinstance(chosen, AutoBackend)
    if (auto or not chosen.exact) and batches and (chosen.difference if auto else chosen).check_batches is None:
        chosen = chosen.with_check_batches([batches[0][:2, :32]])  # the error check's slice
    runs_check = bool(check and batches and (auto or chosen.second_order))
    parallel = data_parallel
    if parallel is not None and parallel is not False and not isinstance(parallel, DataParallel):
        parallel = DataParallel(None if parallel is True else parallel)
    exclude = tuple(zero_embedding_tokens(model))  # every loss below leaves them out, the check's included
    excluded = exclusion_record(exclude, batches, parallel or None)
    exact_loss = curvature_loss(lm_loss, exclude)
    lean_loss = curvature_loss(lm_loss_lean, exclude) if lean_head else exact_loss
    head_bytes = head_transient_bytes(model, batches) if lean_head else 0  # the lean head's chunk temporaries
    transient = head_bytes if loss_transient_bytes is None else loss_transient_bytes
    # the reverse operator of the run's loss: its parameter selection and compute dtype are every operator's
    # of the run (decided here once, by the operator's own rules); the graph floor below is measured on it
    reverse = HessianOperator(
        model, lean_loss, batches, params=params, loss_transient_bytes=transient, compute_dtype=compute_dtype,
        data_parallel=parallel or False,
    )  # fmt: skip
    space, dtype = reverse.space, reverse.compute_dtype
    difference_loss = FidelityLoss(exact_loss) if dtype == torch.float64 else exact_loss  # a float64-sized step
    setup = LmSetup(
        model, batches, params, chosen, runs_check, lean_head, dtype, exclude, excluded, exact_loss, lean_loss,
        difference_loss, head_bytes, None,
    )  # fmt: skip
    if bound:
        setup.bound = {"rel_error": None, "reference": "unavailable: no batch to measure on"}
        if batches:
            setup.bound = setup.bounded_error([batches[0][:2, :32]])
    # the reverse pass's graph, bounded on a short prefix before the whole row is measured
    floor = isinstance(chosen, ReverseBackend) and batches and data_parallel is None
    plan = plan_setup(
        model,
        space.dim,
        space.dtype,
        estimator_dtype(space.dtype),
        max_memory,
        graph_probe=reverse if floor else None,
        check=functools.partial(check_precision, model, build=setup.miniature) if runs_check else None,
        check_optional=auto,  # backend="auto": unchecked, then its exact pass is refused if chosen
    )
    setup.budget = plan.budget
    setup.precision = UNCHECKED if plan.check_refused else plan.check or setup.precision
    return setup
