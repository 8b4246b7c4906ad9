"""What one sweep probe declares: :class:`Probe`.

A probe module (``loss.py``, ``trace.py``, …) ends with ``PROBE = Probe(...)``: the name of its
plan field and that field's default (off), how a plan's value becomes its settings, the settings'
canonical plain form (part of the plan hash), the tasks it adds to a plan, how it runs on a
:class:`~losslens.measure.probes.state.CheckpointState`, the series keys it adds to
:func:`losslens.study.analysis.series` and, where it has one, its report figure.
:mod:`.registry` lists the probes; the plan, the runner, the series and the report loop over it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from losslens.measure.probes.validation import PlanError


def plain(value: Any) -> Any:
    """The canonical form of settings that are plain data already (a bool; a tuple becomes a list)."""
    return list(value) if isinstance(value, tuple) else value


@dataclass(frozen=True)
class Probe:
    """One sweep probe (see the module docstring).

    - ``name``: the probe's name, its plan field (``[probes] name = ...``) and the rows' ``probe``;
    - ``annotation``: the plan field's type (a string, for the docs); ``default``: its value when off;
    - ``settings``: ``plan value -> settings`` (canonical; raises :class:`PlanError`);
    - ``to_dict``: ``settings -> plain data`` for :meth:`losslens.study.sweep.plan.Plan.to_dict` (the plan
      hash); a probe whose form is falsy (None, False, []) is left out of the plan's ``probes``;
    - ``tasks``: ``plan -> [Task]``, this probe's row keys of one checkpoint in execution order;
    - ``run``: ``(CheckpointState, Task) -> ProbeRow``;
    - ``metric``: the metric a bare probe name means in a series key; ``aliases``: more series keys
      ``{key: metric}``; ``spec_keys``: metric names that take a spec (``delta_acc:rtn:4``);
      ``bare_spec``: a bare spec of this probe is a series key of ``metric`` (``gptq:3:g128``);
    - ``figure``: ``(draw, df, phases, specs) -> {key: Figure}`` or None, where ``draw`` is
      :mod:`losslens.study.report.figures` handed in by the report (which sits below this room);
    - ``flags_in_extra``: rows written before per-value ``converged`` flags kept the estimator's
      flag(s) in ``extra["converged"]`` (the store reads them there: :mod:`losslens.study.sweep.store_schema`).
    """

    name: str
    annotation: str
    default: Any
    settings: Callable[[Any], Any]
    tasks: Callable[[Any], list]
    run: Callable[[Any, Any], Any]
    to_dict: Callable[[Any], Any] = plain
    metric: str = ""
    aliases: Mapping[str, str] = field(default_factory=dict)
    spec_keys: tuple[str, ...] = ()
    bare_spec: bool = False
    figure: Callable[..., dict] | None = None
    flags_in_extra: bool = False

    def __post_init__(self):
        if not self.name.isidentifier():
            raise PlanError(f"a probe's name is its plan field and must be an identifier, got {self.name!r}")


__all__ = ["Probe", "plain"]
