"""Every sweep probe, in execution order (cheap probes first): one line per probe.

Adding a probe = one new module in this room that ends with ``PROBE = Probe(...)`` (see
:mod:`.probe`) + one line below. The plan's fields, its tasks, the runner's functions, the series
keys of :mod:`probes.analysis.series` and the report's trajectory figures are loops over
:data:`REGISTRY`.
"""
from __future__ import annotations

from .probe import Probe

from .loss import PROBE as loss  # noqa: E402,I001  (the order of these lines is the execution order)
from .kurtosis import PROBE as kurtosis  # noqa: E402
from .quant import PROBE as quant  # noqa: E402
from .directional import PROBE as directional  # noqa: E402
from .grad_norm import PROBE as grad_norm  # noqa: E402
from .trace import PROBE as trace  # noqa: E402
from .eigen import PROBE as eigen  # noqa: E402
from .block_trace import PROBE as block_trace  # noqa: E402
from .explain import PROBE as explain  # noqa: E402
from .accuracy import PROBE as accuracy  # noqa: E402

REGISTRY: tuple[Probe, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, Probe))
"""The probes, in the order of the lines above."""

BY_NAME: dict[str, Probe] = {p.name: p for p in REGISTRY}
PROBES: tuple[str, ...] = tuple(BY_NAME)
"""Probe names, in execution order."""

__all__ = ["REGISTRY", "BY_NAME", "PROBES"]
