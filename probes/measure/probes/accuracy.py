"""The ``accuracy`` probe: task accuracy through lm-evaluation-harness, FP and quantized
(:mod:`losslens.measure.accuracy`).

Plan: ``accuracy = { tasks = ["embedded"], specs = ["rtn:4"], limit = 200 }`` (:class:`AccuracyProbe`).
Rows ``fp``, ``fp@TASK``, ``SPEC``, ``SPEC@TASK``: ``acc`` (± stderr, 95% CI), ``acc_norm``; for a
spec ``delta_acc`` = acc_q − acc_fp and ``rel_drop`` with paired bootstrap CIs (McNemar p); no
``@TASK``: the mean over tasks. lm-eval runs on the in-memory model; FP is scored once per
checkpoint and shared by every spec (the same items, paired).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from losslens.measure.probes.probe import Probe
from losslens.measure.probes.rows import ProbeRow, metric
from losslens.measure.probes.tasks import make_task, quant_options
from losslens.measure.probes.validation import PlanError, canonical_spec, optional_settings, positive_int


@dataclass(frozen=True)
class AccuracyProbe:
    """Task accuracy through lm-evaluation-harness (:mod:`losslens.measure.accuracy`) of the FP checkpoint and
    of its quantized copies under ``specs``: ``tasks`` (lm-eval names, task YAML paths or folders,
    ``embedded``, ``seed-12``), ``limit`` (a seeded random subsample of that many items per task;
    None: all), ``num_fewshot`` (None: the preset's or task's own), ``seed`` (subsample and
    bootstrap), ``n_boot`` (paired bootstrap resamples for Δacc), ``batch_size`` (sequences per
    forward; not part of the settings hash). Rows: ``fp``, ``fp@TASK``, ``SPEC``, ``SPEC@TASK``
    (:mod:`losslens.measure.accuracy.accuracy_rows`)."""

    tasks: tuple[str, ...] = ("embedded",)
    specs: tuple[str, ...] = ()
    limit: int | None = None
    num_fewshot: int | None = None
    seed: int = 0
    n_boot: int = 2000
    batch_size: int = 32

    def __post_init__(self):
        tasks = (self.tasks,) if isinstance(self.tasks, str) else tuple(self.tasks)
        if not tasks or not all(isinstance(t, str) and t.strip() for t in tasks):
            raise PlanError(f"accuracy.tasks must be a non-empty list of task names / paths, got {self.tasks!r}")
        specs = (self.specs,) if isinstance(self.specs, str) else tuple(self.specs)
        object.__setattr__(self, "tasks", tasks)
        object.__setattr__(self, "specs", specs)
        if self.limit is not None:
            positive_int("accuracy.limit", self.limit)
        if self.num_fewshot is not None:
            positive_int("accuracy.num_fewshot", self.num_fewshot, minimum=0)
        positive_int("accuracy.n_boot", self.n_boot, minimum=0)
        positive_int("accuracy.batch_size", self.batch_size)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise PlanError(f"accuracy.seed must be an integer, got {self.seed!r}")

    def task_names(self) -> tuple[str, ...]:
        """The task names the rows are keyed by (presets and folders expanded)."""
        from losslens.measure.accuracy.selection import AccuracyError, select_tasks

        try:
            return select_tasks(list(self.tasks)).names
        except AccuracyError as exc:
            raise PlanError(f"accuracy.tasks: {exc}") from exc


def settings(v) -> AccuracyProbe | None:
    a = optional_settings("accuracy", AccuracyProbe, v)
    return a if a is None else replace(a, specs=tuple(canonical_spec(s, "accuracy") for s in a.specs))


def to_dict(a: AccuracyProbe | None):
    return None if a is None else {**asdict(a), "tasks": list(a.tasks), "specs": list(a.specs)}


def tasks(plan) -> list:
    a = plan.accuracy
    if a is None:
        return []
    names = a.task_names()
    opts = {
        "tasks": list(a.tasks),
        "names": list(names),
        "limit": a.limit,
        "num_fewshot": a.num_fewshot,
        "seed": a.seed,
        "n_boot": a.n_boot,
    }
    q = quant_options(plan)
    out = []
    for v in ("fp", *a.specs):
        vo = {**opts, **({"quant_modules": q["quant_modules"], "calibration": q["calibration"]} if v != "fp" else {})}
        out.append(make_task("accuracy", v, vo))
        out.extend(make_task("accuracy", f"{v}@{n}", vo) for n in names)
    return out


def _report(st, variant: str):
    """The :class:`losslens.measure.accuracy.AccuracyReport` of ``fp`` or a quantizer spec (with FP), scored
    once per checkpoint; FP's scores are shared by every spec (the same items, paired)."""
    from losslens.measure.accuracy.variants import FP, evaluate_variants

    done = st.cache.setdefault("accuracy", {})
    if variant not in done:
        from losslens.measure.accuracy.harness import prepared_once
        from losslens.measure.accuracy.selection import select_tasks
        from losslens.lm.data import load_tokenizer

        a = st.plan.accuracy
        if st.cache.get("tokenizer") is None:
            st.cache["tokenizer"] = load_tokenizer(st.ref)
        sel = select_tasks(list(a.tasks))
        prep = prepared_once(sel, a.limit, a.num_fewshot, a.seed)
        fp = done[FP].scores[FP] if FP in done else None
        specs = () if variant == FP else (variant,)
        done[variant] = evaluate_variants(
            st.model,
            st.cache["tokenizer"],
            sel,
            specs,
            st.token_sets.get("calibration"),
            st.plan.quant_modules,
            a.limit,
            a.num_fewshot,
            a.seed,
            a.batch_size,
            a.n_boot,
            fp_scores=fp,
            prepared=prep,
        )
        if FP not in done:
            done[FP] = done[variant]
    return done[variant]


def run(st, task) -> ProbeRow:
    from losslens.measure.accuracy.accuracy_rows import row_values, split_spec

    variant, name = split_spec(task.spec)
    ms, extra = row_values(_report(st, variant), variant, name)
    return ProbeRow(
        st.label, "accuracy", task.spec, metrics=[metric(*m) for m in ms], extra=extra, seed=task.opts["seed"]
    )


PROBE = Probe(
    "accuracy",
    "AccuracyProbe | None",
    None,
    settings,
    tasks,
    run,
    to_dict=to_dict,
    metric="acc",
    spec_keys=("delta_acc", "rel_drop", "acc", "acc_norm"),
)
