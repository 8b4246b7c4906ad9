"""Every sweep probe, in execution order (cheap probes first): one line per probe.

Adding a probe = one new module in this room that ends with ``PROBE = Probe(...)`` (see
:mod:`.probe`) + one line below. The plan's fields, its tasks, the runner's functions, the series
keys of :mod:`losslens.study.analysis.series` and the report's trajectory figures are loops over
:data:`REGISTRY`.
"""

from __future__ import annotations

from losslens.measure.probes.probe import Probe

# One line per probe. The order of the lines is the execution order: never sort them.
# isort: off
from losslens.measure.probes.loss import PROBE as loss  # noqa: F401 - registers the probe (REGISTRY reads globals())
from losslens.measure.probes.kurtosis import PROBE as kurtosis  # noqa: F401 - registers the probe (REGISTRY reads globals())
from losslens.measure.probes.weight_norm import PROBE as weight_norm  # noqa: F401 - registers the probe (REGISTRY reads globals())
from losslens.measure.probes.quant import PROBE as quant  # noqa: F401 - registers the probe (REGISTRY reads globals())
from losslens.measure.probes.directional import PROBE as directional  # noqa: F401 - registers the probe (REGISTRY reads globals())
from losslens.measure.probes.grad_norm import PROBE as grad_norm  # noqa: F401 - registers the probe (REGISTRY reads globals())
from losslens.measure.probes.trace import PROBE as trace  # noqa: F401 - registers the probe (REGISTRY reads globals())
from losslens.measure.probes.eigen import PROBE as eigen  # noqa: F401 - registers the probe (REGISTRY reads globals())
from losslens.measure.probes.block_trace import PROBE as block_trace  # noqa: F401 - registers the probe (REGISTRY reads globals())
from losslens.measure.probes.explain import PROBE as explain  # noqa: F401 - registers the probe (REGISTRY reads globals())
from losslens.measure.probes.accuracy import PROBE as accuracy  # noqa: F401 - registers the probe (REGISTRY reads globals())
# isort: on

REGISTRY: tuple[Probe, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, Probe))
"""The probes, in the order of the lines above."""

BY_NAME: dict[str, Probe] = {p.name: p for p in REGISTRY}
PROBES: tuple[str, ...] = tuple(BY_NAME)
"""Probe names, in execution order."""

__all__ = ["REGISTRY", "BY_NAME", "PROBES"]
