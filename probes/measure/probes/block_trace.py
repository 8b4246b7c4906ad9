"""The ``block_trace`` probe: the Hessian trace of each group of parameters on the curvature set.

Plan: ``block_trace = { groups = "block", num_matvecs = 50 }`` (:class:`BlockTraceProbe`). One row,
spec = the groups' name (``custom`` for a mapping): one ``trace`` metric per group with stderr and
95% CI, the tidy table's spec = the group's name (extra: ``sizes``, ``total``, ``total_stderr``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Mapping

from losslens.measure.probes.probe import Probe
from losslens.measure.probes.rows import ProbeRow, metric
from losslens.measure.probes.tasks import curvature_options, make_task
from losslens.measure.probes.validation import PlanError, optional_settings, positive_int

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class BlockTraceProbe:
    """Per-group Hessian traces. ``groups``: 'module' | 'parameter' | 'block' (one group per decoder
    block plus 'other') or a mapping ``{group: glob | [globs]}`` (as :meth:`ParamSpace.groups`)."""

    groups: Any = "block"
    num_matvecs: int = 50

    def __post_init__(self):
        g = self.groups
        if isinstance(g, str):
            if g not in ("module", "parameter", "block"):
                raise PlanError(
                    f"block_trace.groups {g!r} is unknown; valid: 'block', 'module', 'parameter' or a mapping of globs"
                )
        elif isinstance(g, Mapping):
            if not g:
                raise PlanError("block_trace.groups mapping is empty")
            norm = {}
            for k, v in g.items():
                globs = (v,) if isinstance(v, str) else tuple(v)
                if not globs or not all(isinstance(x, str) for x in globs):
                    raise PlanError(f"block_trace.groups[{k!r}] must be a glob or a list of globs, got {v!r}")
                norm[str(k)] = globs
            object.__setattr__(self, "groups", tuple(sorted(norm.items())))
        elif isinstance(g, tuple) and all(isinstance(x, tuple) and len(x) == 2 for x in g):
            pass  # already normalised
        else:
            raise PlanError(f"block_trace.groups must be 'block', 'module', 'parameter' or a mapping, got {g!r}")
        positive_int("block_trace.num_matvecs", self.num_matvecs)

    def groups_arg(self):
        """The groups in the form :meth:`ParamSpace.groups` takes ('block' is resolved by the runner)."""
        return self.groups if isinstance(self.groups, str) else {k: list(v) for k, v in self.groups}


def _jsonable_groups(g):
    return g if isinstance(g, str) else {k: list(v) for k, v in g}


def to_dict(s: BlockTraceProbe | None):
    return None if s is None else {**asdict(s), "groups": _jsonable_groups(s.groups)}


def tasks(plan) -> list:
    b = plan.block_trace
    if b is None:
        return []
    name = b.groups if isinstance(b.groups, str) else "custom"
    return [
        make_task(
            "block_trace",
            name,
            {
                "groups": _jsonable_groups(b.groups),
                "num_matvecs": b.num_matvecs,
                **curvature_options(plan),
                "seed": plan.seed,
            },
            curvature=True,
        )
    ]


def _block_groups(model: torch.nn.Module, groups):
    if groups != "block":
        return (
            groups
            if isinstance(groups, str)
            else {k: list(v) for k, v in (groups.items() if isinstance(groups, Mapping) else groups)}
        )
    from losslens.geometry.base.params import literal_glob
    from losslens.lm.core.modules import find_blocks

    prefix, blocks = find_blocks(model)
    return {f"block{i}": f"{literal_glob(prefix)}.{i}.*" for i in range(len(blocks))}


def run(st, task) -> ProbeRow:
    from losslens.geometry.estimators.blocks import block_traces

    o = task.opts
    groups = o["groups"]
    if isinstance(groups, tuple):  # frozen mapping
        groups = {k: list(v) for k, v in groups}
    res = block_traces(st.hessian(), _block_groups(st.model, groups), num_matvecs=o["num_matvecs"], seed=o["seed"])
    ms = [metric("trace", res.values[g], res.stderr[g], res.ci_low[g], res.ci_high[g], spec=g) for g in res.values]
    return ProbeRow(
        st.label,
        "block_trace",
        task.spec,
        metrics=ms,
        extra={
            "sizes": dict(res.sizes),
            "total": float(res.total.value),
            "total_stderr": float(res.total.stderr),
            "memory": res.total.memory,
        },
        n_hvp=int(res.num_matvecs),
        seed=o["seed"],
    )


PROBE = Probe(
    "block_trace",
    "BlockTraceProbe | None",
    None,
    lambda v: optional_settings("block_trace", BlockTraceProbe, v),
    tasks,
    run,
    to_dict=to_dict,
    metric="trace",
)
