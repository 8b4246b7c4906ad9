"""``task_accuracy(model, tokenizer, tasks, specs)``: task accuracy of a model and its quantized copies.

For the FP model and every quantizer spec, lm-evaluation-harness scores the same items
(:func:`losslens.measure.accuracy.harness.score_model`); for every spec and task, Δacc = acc_q − acc_fp and
the relative drop (acc_fp − acc_q)/acc_fp get paired intervals (:func:`losslens.measure.accuracy.stats.paired_delta`),
also for the mean over tasks (each task weighs the same; MMLU is one task). The headline metric
of a task is ``acc`` (``acc_norm`` where a task has no ``acc``); ``acc_norm`` is recorded as well.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from losslens.measure.accuracy.harness import TaskScore, prepare_tasks, score_model
from losslens.measure.accuracy.selection import AccuracyError, TaskSelection, TaskUnavailable, select_tasks
from losslens.measure.accuracy.stats import PairedDelta, macro_mean, paired_delta

__all__ = ["AccuracyReport", "task_accuracy", "evaluate_variants", "MEAN", "FP"]

FP = "fp"
MEAN = "mean"


@dataclass
class AccuracyReport:
    """What :func:`task_accuracy` measured.

    ``scores[variant][task]``: :class:`TaskScore` or the task's :class:`TaskUnavailable`
    (variant ``"fp"`` or a quantizer spec); ``means[variant]``: (mean headline accuracy, stderr)
    over the tasks that every variant scored; ``deltas[spec][task | "mean"]``: :class:`PairedDelta`
    against FP; ``errors[variant]``: a variant that could not run (its quantizer failed).
    """

    tasks: tuple[str, ...]
    specs: tuple[str, ...]
    scores: dict[str, dict[str, Any]] = field(default_factory=dict)
    means: dict[str, tuple[float, float]] = field(default_factory=dict)
    deltas: dict[str, dict[str, PairedDelta]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    settings: dict = field(default_factory=dict)

    def records(self) -> list[dict]:
        """One plain dict per (variant, task) and per variant's mean: acc, stderr, n, Δacc with its
        paired 95% CI, relative drop with its CI, McNemar p."""
        rows = []
        for v in (FP, *self.specs):
            if v in self.errors:
                rows.append({"variant": v, "task": MEAN, "error": self.errors[v]})
                continue
            for t in (*self.tasks, MEAN):
                s = self.scores.get(v, {}).get(t) if t != MEAN else None
                if isinstance(s, TaskUnavailable):
                    rows.append({"variant": v, "task": t, "error": str(s)})
                    continue
                if t == MEAN:
                    if v not in self.means:
                        continue
                    r = {
                        "variant": v,
                        "task": MEAN,
                        "acc": self.means[v][0],
                        "acc_stderr": self.means[v][1],
                        "n": sum(self.scores[v][x].n for x in self.scored_tasks),
                        "metric": "acc",
                        "tasks": list(self.scored_tasks),
                    }
                    missing = [x for x in self.tasks if x not in self.scored_tasks]
                    if missing:
                        r["note"] = (
                            f"mean over {len(self.scored_tasks)} of {len(self.tasks)} tasks (missing: "
                            f"{', '.join(missing)})"
                        )
                else:
                    r = {
                        "variant": v,
                        "task": t,
                        "acc": s.acc if s.acc is not None else s.acc_norm,
                        "acc_stderr": s.acc_stderr if s.acc is not None else s.acc_norm_stderr,
                        "n": s.n,
                        "metric": s.headline,
                        "acc_norm": s.acc_norm,
                        "num_fewshot": max(s.num_fewshot.values(), default=0),
                    }
                d = self.deltas.get(v, {}).get(t)
                if d is not None:
                    r.update(
                        delta_acc=d.delta,
                        delta_ci_low=d.ci_low,
                        delta_ci_high=d.ci_high,
                        rel_drop=d.rel_drop,
                        rel_ci_low=d.rel_ci_low,
                        rel_ci_high=d.rel_ci_high,
                        p_mcnemar=d.p,
                    )
                rows.append(r)
        return rows

    @property
    def scored_tasks(self) -> tuple[str, ...]:
        """Tasks that every variant scored (the mean is over these)."""
        ok = [
            t
            for t in self.tasks
            if all(
                isinstance(self.scores.get(v, {}).get(t), TaskScore) for v in (FP, *self.specs) if v not in self.errors
            )
        ]
        return tuple(ok)


def evaluate_variants(
    model,
    tokenizer,
    selection: TaskSelection,
    specs: Sequence[str] = (),
    calibration=None,
    modules=None,
    limit: int | None = None,
    num_fewshot: int | None = None,
    seed: int = 0,
    batch_size: int = 32,
    n_boot: int = 2000,
    keep_samples: bool = False,
    fp_scores=None,
    prepared=None,
    progress: bool = False,
) -> AccuracyReport:
    """The work of :func:`task_accuracy` on a :class:`TaskSelection`. ``fp_scores``: FP scores
    already computed on the same prepared tasks (reused, not recomputed); ``prepared``: the
    :func:`prepare_tasks` result to reuse. ``progress``: the variants scored / planned with an ETA on
    stderr (:func:`losslens.geometry.base.progress.progress_bar`); lm-eval's own bars only on a terminal."""
    import sys

    from losslens.geometry.base.progress import progress_bar
    from losslens.lm.quant import quantize

    prepared = prepared if prepared is not None else prepare_tasks(selection, limit, num_fewshot, seed)
    rep = AccuracyReport(
        tasks=tuple(selection.names),
        specs=tuple(specs),
        settings={
            "limit": limit,
            "num_fewshot": num_fewshot,
            "seed": seed,
            "batch_size": batch_size,
            "n_boot": n_boot,
            "requested": list(selection.requested),
        },
    )
    bars = bool(progress is True and sys.stderr.isatty())  # lm-eval's tqdm in a pipe: \r-lines, so terminal only
    n = len(specs) + (fp_scores is None)
    with progress_bar(progress, n, what="variants scored", unit="variant", label="accuracy") as bar:
        if fp_scores is None:
            bar.describe(FP)
        rep.scores[FP] = (
            fp_scores
            if fp_scores is not None
            else score_model(model, tokenizer, prepared, batch_size, limit, seed, keep_samples, bars)
        )
        bar.update(int(fp_scores is None))
        for spec in specs:
            bar.describe(str(spec))
            try:
                qm = quantize(model, spec, calibration=calibration, modules=modules)
            except Exception as exc:  # noqa: BLE001 - the variant's row fails, the others run
                rep.errors[spec] = f"{type(exc).__name__}: {exc}"
                bar.update()
                continue
            rep.scores[spec] = score_model(qm.model, tokenizer, prepared, batch_size, limit, seed, keep_samples, bars)
            del qm
            bar.update()
    fill_statistics(rep, n_boot, seed)
    return rep


def fill_statistics(rep: AccuracyReport, n_boot: int = 2000, seed: int = 0) -> None:
    """Means per variant and paired deltas per spec and task (and of the mean) from ``rep.scores``."""
    tasks = rep.scored_tasks
    for v, per in rep.scores.items():
        if tasks:
            rep.means[v] = macro_mean([_acc(per[t]) for t in tasks], [_se(per[t]) for t in tasks])
    fp = rep.scores.get(FP, {})
    for spec in rep.specs:
        if spec in rep.errors or spec not in rep.scores:
            continue
        d: dict[str, PairedDelta] = {}
        for t in rep.tasks:
            a, b = fp.get(t), rep.scores[spec].get(t)
            if isinstance(a, TaskScore) and isinstance(b, TaskScore):
                if a.items != b.items:
                    raise AccuracyError(f"task {t!r}: FP and {spec} were scored on different items; cannot pair them")
                d[t] = paired_delta(a.outcomes(), b.outcomes(), n_boot, seed)
        if tasks:
            d[MEAN] = paired_delta(
                [fp[t].outcomes() for t in tasks], [rep.scores[spec][t].outcomes() for t in tasks], n_boot, seed
            )
        rep.deltas[spec] = d


def _acc(s: TaskScore) -> float:
    return s.acc if s.acc is not None else s.acc_norm


def _se(s: TaskScore) -> float:
    v = s.acc_stderr if s.acc is not None else s.acc_norm_stderr
    return v if v is not None else math.nan


def task_accuracy(
    model,
    tokenizer,
    tasks: "str | Sequence[str]" = "embedded",
    specs: Sequence[str] = (),
    calibration=None,
    modules: Sequence[str] | None = None,
    limit: int | None = None,
    num_fewshot: int | None = None,
    seed: int = 0,
    batch_size: int = 32,
    n_boot: int = 2000,
    keep_samples: bool = False,
    progress: bool = False,
) -> AccuracyReport:
    """Task accuracy of ``model`` (FP) and of its quantized copies under ``specs``.

    Args:
        model: a ``transformers`` causal LM in memory (any device / dtype; left unchanged).
        tokenizer: its tokenizer object.
        tasks: lm-eval task/group names, task YAML paths or folders, ``"embedded"``, ``"seed-12"``
            (:func:`losslens.measure.accuracy.selection.select_tasks`).
        specs: quantizer specs (``"rtn:4:g128"``, ``"gptq:4"``: the latter needs ``calibration``).
        limit: a seeded random subsample of ``limit`` items per task (recorded); None: every item.
        num_fewshot: few-shot examples for every task whose YAML does not fix 0; None: the preset's
            (seed-12: 5) or the task's own.
        seed: the subsample's seed and the bootstrap's.
        n_boot: paired bootstrap resamples for the Δacc intervals.
        keep_samples: keep per-item log-likelihoods and (context, continuation) pairs.

    Cost: (1 + len(specs)) × one forward per (item, choice) pair, plus each quantizer once.
    Returns an :class:`AccuracyReport`.
    """
    sel = tasks if isinstance(tasks, TaskSelection) else select_tasks(tasks)
    return evaluate_variants(
        model,
        tokenizer,
        sel,
        specs,
        calibration,
        modules,
        limit,
        num_fewshot,
        seed,
        batch_size,
        n_boot,
        keep_samples,
        progress=progress,
    )
