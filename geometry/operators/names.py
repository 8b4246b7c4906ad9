"""Backend names → backend objects: the one place where a product backend's name is read.

Each backend class carries its name and what it does as class attributes (``name``, ``exact``,
``second_order``, ``keeps_graphs``, ``lean_head``, ``shardable``, ``summary``:
:class:`~losslens.geometry.operators.backend.ProductBackend`); this module lists the classes once
(:data:`BACKEND_CLASSES`) and builds every name from them. ``HessianOperator(backend=...)``, the CLI's
``--backend`` and a plan's ``backend`` field give a name; :func:`backend_named` turns it into the object
and :func:`backend_class` into its class. Everywhere else a backend is an object or a class, asked what
it does. A new backend is one class with its attributes plus one entry of :data:`BACKEND_CLASSES`.
"""

from __future__ import annotations

from typing import Any

from losslens.geometry.operators.auto import AutoBackend
from losslens.geometry.operators.backend import ProductBackend
from losslens.geometry.operators.difference import DifferenceBackend
from losslens.geometry.operators.forward import ForwardBackend
from losslens.geometry.operators.interface import OperatorError
from losslens.geometry.operators.reverse import ReverseBackend

__all__ = [
    "BACKEND_CLASSES",
    "BACKEND_NAMES",
    "BACKENDS",
    "DEFAULT_BACKEND",
    "SECOND_ORDER_BACKENDS",
    "backend_class",
    "backend_help",
    "backend_named",
    "is_default_backend",
]

#: Every backend class, the default first (the CLI's ``--backend`` choices, in this order).
BACKEND_CLASSES: tuple[type, ...] = (ReverseBackend, ForwardBackend, DifferenceBackend, AutoBackend)
#: The names :func:`backend_named` maps to backend objects.
BACKEND_NAMES: tuple[str, ...] = tuple(c.name for c in BACKEND_CLASSES)
#: The former name of :data:`BACKEND_NAMES`.
BACKENDS = BACKEND_NAMES
#: The default backend's name (plans omit it from their hash, so earlier plans keep theirs).
DEFAULT_BACKEND: str = ReverseBackend.name
#: The product backends that need second-order autograd rules (what the second-order check compares).
SECOND_ORDER_BACKENDS: tuple[str, ...] = tuple(
    c.name for c in BACKEND_CLASSES if issubclass(c, ProductBackend) and c.second_order
)


def backend_class(name: str) -> type:
    """The class of the backend called ``name`` (one of :data:`BACKEND_NAMES`), to ask what it does
    without building it. Raises :class:`~losslens.geometry.operators.interface.OperatorError` otherwise."""
    for cls in BACKEND_CLASSES:
        if cls.name == name:
            return cls
    raise OperatorError(f"backend must be one of {', '.join(map(repr, BACKEND_NAMES))}, got {name!r}")


def backend_named(name: Any) -> Any:
    """The backend object for ``name`` (one of :data:`BACKEND_NAMES`) with its default settings; a
    configured :class:`ProductBackend` or :class:`~losslens.geometry.operators.auto.AutoBackend` passes
    through unchanged (``DifferenceBackend(step=..., tolerance=...)``, ``ReverseBackend(cache_graphs=True)``).
    Raises :class:`~losslens.geometry.operators.interface.OperatorError` for anything else."""
    if isinstance(name, (ProductBackend, AutoBackend)):
        return name
    return backend_class(name)()


def is_default_backend(name: str) -> bool:
    """Whether ``name`` is :data:`DEFAULT_BACKEND` (plans leave it out of their hash)."""
    return name == DEFAULT_BACKEND


def backend_help() -> str:
    """The choices of the CLI's ``--backend``, each with its class's ``summary``, the default marked."""
    parts = [
        f"{c.name} ({c.summary}{', default' if c.name == DEFAULT_BACKEND else ''})" if c.summary else c.name
        for c in BACKEND_CLASSES
    ]
    return "HVP backend: " + " | ".join(parts)
