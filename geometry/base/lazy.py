"""A package's public names imported from their modules on first use (PEP 562).

``__getattr__, __dir__ = lazy_exports(__name__, globals(), {"name": "package.module", ...})`` in a
package's ``__init__`` makes ``package.name`` import ``package.module`` only when first read, and
keeps the value in the package's namespace after that. Used by the front door ``losslens`` and by
``losslens.geometry``, so importing either imports no torch until a name is used. Imports nothing.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, namespace: dict[str, Any], where: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` whose public names are ``where``'s keys,
    each defined under the same name in the module ``where[name]``; ``namespace``: the package's
    ``globals()`` (a loaded name is stored there, so the next read is a plain lookup)."""

    def __getattr__(name: str) -> Any:
        try:
            module = where[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
