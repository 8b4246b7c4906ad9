"""Plain data for JSON: the one converter behind every ``to_dict`` / ``describe`` / store column.

:func:`jsonable` turns results, metadata and references into JSON-ready builtins (dict with string
keys, list, str, int, float, bool, None). Used by the estimator results and planes here and by
probes' checkpoint references and results store.
"""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from pathlib import PurePath
from typing import Any, Callable, Mapping

import numpy as np

__all__ = ["jsonable"]


def jsonable(x: Any, fallback: Callable[[Any], Any] = str) -> Any:
    """``x`` as JSON-ready builtins, recursively.

    numpy arrays -> nested lists; numpy scalars -> Python scalars; mappings -> dicts with ``str``
    keys; lists, tuples and sets -> lists; objects with ``to_dict()`` -> that dict; other dataclass
    instances -> :func:`dataclasses.asdict`; paths -> ``str``; anything else -> ``fallback(x)``
    (``str`` by default; ``repr`` keeps a type hint; ``lambda v: v`` passes it through).
    Also usable as ``json.dumps(obj, default=jsonable)``.
    """
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        return x.item()
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if isinstance(x, Mapping):
        return {str(k): jsonable(v, fallback) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [jsonable(v, fallback) for v in x]
    if hasattr(x, "to_dict"):
        return jsonable(x.to_dict(), fallback)
    if is_dataclass(x) and not isinstance(x, type):
        return jsonable(asdict(x), fallback)
    if isinstance(x, PurePath):
        return str(x)
    return fallback(x)
