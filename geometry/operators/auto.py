"""``backend="auto"``: the exact backend when its pass fits the budget, else the measured difference backend.

:class:`AutoBackend` is not a way to compute products: :meth:`AutoBackend.choose` prices the exact
reverse pass and the difference pass on the operator and returns the backend object to use with
its reason (``backend_choice``: what was chosen, why, the bytes and, for the difference backend,
its measured error).
"""

from __future__ import annotations

from typing import Any

from losslens.geometry.operators.difference import DifferenceBackend
from losslens.geometry.operators.interface import OperatorError
from losslens.geometry.operators.backend import ProductBackend
from losslens.geometry.operators.reverse import ReverseBackend

__all__ = ["AutoBackend"]


class AutoBackend:
    """Choose between the exact reverse backend and ``difference`` (their settings) for an operator.

    Args:
        difference: the difference backend to fall back on (its step, stencil, check batches and
            ``tolerance``: the measured relative error above which it is refused).
        reverse: the reverse backend to prefer (its ``vectorize`` and ``cache_graphs``; default ``ReverseBackend()``).
    """

    name = "auto"
    #: the flags of :class:`~losslens.geometry.operators.backend.ProductBackend`, before the choice: neither
    #: backend it may choose is known to be exact, to hold graphs, to take the lean head or to run sharded
    exact = False
    keeps_graphs = False
    lean_head = False
    shardable = False
    summary = f"{ReverseBackend.name} when its pass fits --max-memory, else {DifferenceBackend.name}"

    def __init__(self, difference: DifferenceBackend | None = None, reverse: ReverseBackend | None = None):
        self.difference = difference or DifferenceBackend()
        self.reverse = reverse or ReverseBackend()

    @property
    def tolerance(self) -> float:
        """The measured relative error above which the difference backend is refused (its ``tolerance``)."""
        return self.difference.tolerance

    def __repr__(self) -> str:
        return f"AutoBackend({self.difference!r}, {self.reverse!r})"

    def with_check_batches(self, check_batches: Any) -> "AutoBackend":
        """These settings with ``check_batches`` as the difference backend's error-check batches."""
        return AutoBackend(self.difference.with_check_batches(check_batches), self.reverse)

    def choose(self, op: Any) -> tuple[ProductBackend, dict, dict | None]:
        """``(backend, backend_choice, hvp_check)``: the reverse backend when its pass (one vector,
        no graph cache) plus three vectors (the least any estimator holds) fits ``op.max_memory``;
        else the difference backend when its pass fits and its measured error is ≤ ``tolerance``
        (with that measurement), else :class:`OperatorError` (one line); the reverse backend when
        neither pass fits (the estimators then refuse with the bytes needed)."""
        from losslens.geometry.memory.budget import format_bytes, resolve_budget

        budget = resolve_budget(op.max_memory, op.device)
        state = 3 * op.dim * op.dtype.itemsize
        reverse = self.reverse.for_operator()
        try:
            exact = reverse.pass_bytes(op, 1, cached=False) + state
        except (RuntimeError, NotImplementedError, OperatorError) as exc:
            exact, why_not = None, f"the exact pass cannot run ({type(exc).__name__}: {str(exc)[:120]})"
        else:
            why_not = f"the exact pass needs {format_bytes(exact)} of a {format_bytes(budget)} budget"
        if exact is not None and exact <= budget:
            return (
                reverse,
                {
                    "chosen": reverse.name,
                    "why": f"the exact pass fits: {format_bytes(exact)} of {format_bytes(budget)}",
                    "exact_bytes": exact,
                    "budget_bytes": budget,
                },
                None,
            )
        diff = self.difference.pass_bytes(op, 1) + state
        if diff > budget:
            return (
                reverse,
                {
                    "chosen": reverse.name,
                    "why": f"{why_not} and the difference pass {format_bytes(diff)}: "
                    "neither fits (the estimators refuse)",
                    "exact_bytes": exact,
                    "difference_bytes": diff,
                    "budget_bytes": budget,
                },
                None,
            )
        check = self.difference.check(op)
        err = check["rel_error"]
        if err is None or not err <= self.tolerance:
            measured = "could not be measured (no exact product on the check slice)" if err is None else f"is {err:.2g}"
            raise OperatorError(
                f"backend={self.name!r}: {why_not} and the difference backend's error {measured}, above its "
                f"tolerance {self.tolerance:g}; raise max_memory, loosen it "
                f"(AutoBackend(DifferenceBackend(tolerance=...))) or pass backend={self.difference.name!r}"
            )
        return (
            self.difference,
            {
                "chosen": self.difference.name,
                "why": f"{why_not}; the difference pass fits "
                f"({format_bytes(diff)}) and its measured error {err:.2g} is within {self.tolerance:g}",
                "exact_bytes": exact,
                "difference_bytes": diff,
                "budget_bytes": budget,
                "rel_error": err,
            },
            check,
        )
