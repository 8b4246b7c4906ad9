"""Backend names → backend objects: the one place where a product backend's name is read.

``HessianOperator(backend="difference")``, the CLI's ``--backend`` and a plan's ``backend`` field
give a name; :func:`backend_named` turns it into the object (:mod:`losslens.geometry.operators.backend`).
Everywhere else a backend is an object, asked what it does (``exact``, ``second_order``, ...).
"""

from __future__ import annotations

from typing import Any, Sequence

from losslens.geometry.operators.auto import AutoBackend
from losslens.geometry.operators.backend import ProductBackend
from losslens.geometry.operators.difference import DEFAULT_TOLERANCE, DifferenceBackend
from losslens.geometry.operators.forward import ForwardBackend
from losslens.geometry.operators.interface import OperatorError
from losslens.geometry.operators.reverse import ReverseBackend

__all__ = ["BACKENDS", "DEFAULT_BACKEND", "backend_named", "is_default_backend"]

#: The names :func:`backend_named` maps to backend objects (the CLI's ``--backend`` choices).
BACKENDS = ("reverse", "forward", "difference", "auto")
#: The default backend's name (plans omit it from their hash, so earlier plans keep theirs).
DEFAULT_BACKEND = "reverse"


def backend_named(
    name: Any,
    difference_step: float | None = None,
    richardson: bool = False,
    check_batches: Sequence[Any] | None = None,
    difference_tolerance: float | None = None,
) -> Any:
    """The backend object for ``name`` (one of :data:`BACKENDS`) with the difference backend's
    settings; a :class:`ProductBackend` or :class:`~losslens.geometry.operators.auto.AutoBackend` passes
    through unchanged. Raises :class:`~losslens.geometry.operators.interface.OperatorError` for anything else."""
    if isinstance(name, (ProductBackend, AutoBackend)):
        return name
    difference = lambda: DifferenceBackend(difference_step, richardson, check_batches)  # noqa: E731
    makers = {
        "reverse": ReverseBackend,
        "forward": ForwardBackend,
        "difference": difference,
        "auto": lambda: AutoBackend(
            difference(), DEFAULT_TOLERANCE if difference_tolerance is None else difference_tolerance
        ),
    }
    if not isinstance(name, str) or name not in makers:
        raise OperatorError(f"backend must be 'reverse', 'forward', 'difference' or 'auto', got {name!r}")
    return makers[name]()


def is_default_backend(name: str) -> bool:
    """Whether ``name`` is :data:`DEFAULT_BACKEND` (plans leave it out of their hash)."""
    return name == DEFAULT_BACKEND
