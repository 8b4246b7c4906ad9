"""The numbers of one stored accuracy row, as plain data (the sweep wraps them in its ``ProbeRow``).

A sweep's ``accuracy`` probe stores, per checkpoint and per variant V (``fp`` or a quantizer spec):

- row ``spec = V``: the mean over the tasks (each task weighs the same; MMLU is one task):
  ``acc`` (headline: ``acc``, or ``acc_norm`` for a task without ``acc``) ± stderr, ``acc_norm``
  when every task has it, and for a quantizer ``delta_acc`` = acc_q − acc_fp with its paired
  bootstrap 95% interval and ``rel_drop`` = (acc_fp − acc_q)/acc_fp with its interval;
- row ``spec = V@TASK`` per task: the same for that task (plus McNemar's p in ``extra``).

A task that could not be loaded fails its rows with its one-line error; the mean then fails too
(it is the mean over *all* the requested tasks or nothing).
"""

from __future__ import annotations

import hashlib
import math

from losslens.measure.accuracy.variants import FP, MEAN, AccuracyReport
from losslens.measure.accuracy.harness import TaskScore
from losslens.measure.accuracy.selection import AccuracyError, TaskUnavailable

__all__ = ["row_values", "split_spec"]

Z95 = 1.959963984540054


def split_spec(spec: str) -> tuple[str, str]:
    """``"rtn:4@arc_easy"`` → ``("rtn:4", "arc_easy")``; ``"rtn:4"`` → ``("rtn:4", "mean")``."""
    variant, _, task = spec.partition("@")
    return variant, task or MEAN


def _m(name, value, se=None):
    if value is None:
        return None
    lo, hi = (value - Z95 * se, value + Z95 * se) if se is not None and math.isfinite(se) else (None, None)
    return (name, value, se, lo, hi)


def row_values(rep: AccuracyReport, variant: str, task: str = MEAN) -> tuple[list[tuple], dict]:
    """(metrics as ``(name, value, stderr, ci_low, ci_high)`` tuples, extra) of one stored row.
    Raises the task's :class:`TaskUnavailable`, or :class:`AccuracyError` when the variant failed
    or the mean lacks a task."""
    if variant in rep.errors:
        raise AccuracyError(f"accuracy of {variant}: the quantizer failed: {rep.errors[variant]}")
    scores = rep.scores[variant]
    extra: dict = {
        "limit": rep.settings.get("limit"),
        "seed": rep.settings.get("seed"),
        "num_fewshot_arg": rep.settings.get("num_fewshot"),
    }
    if task == MEAN:
        missing = [t for t in rep.tasks if not isinstance(scores.get(t), TaskScore)]
        if missing:
            first = scores.get(missing[0])
            raise AccuracyError(
                f"the mean over {len(rep.tasks)} tasks lacks {missing}: "
                + (str(first) if isinstance(first, TaskUnavailable) else "not scored")
            )
        acc, se = rep.means[variant]
        ss = [scores[t] for t in rep.tasks]
        out = [_m("acc", acc, se)]
        if all(s.acc_norm is not None for s in ss):
            from losslens.measure.accuracy.stats import macro_mean

            out.append(_m("acc_norm", *macro_mean([s.acc_norm for s in ss], [s.acc_norm_stderr for s in ss])))
        extra.update(
            n=sum(s.n for s in ss),
            tasks=list(rep.tasks),
            headline={s.task: s.headline for s in ss},
            per_task={s.task: s.acc if s.acc is not None else s.acc_norm for s in ss},
        )
    else:
        s = scores.get(task)
        if isinstance(s, TaskUnavailable):
            raise s
        out = [
            _m("acc", s.acc, s.acc_stderr) if s.acc is not None else _m("acc", s.acc_norm, s.acc_norm_stderr),
            _m("acc_norm", s.acc_norm, s.acc_norm_stderr),
        ]
        extra.update(
            n=s.n,
            headline=s.headline,
            num_fewshot=s.num_fewshot,
            version=s.version,
            n_truncated=s.n_truncated,
            items_sha256=hashlib.sha256("\n".join(s.items).encode()).hexdigest()[:16],
            subsample={k: len(v) for k, v in s.doc_ids.items()} if s.limit is not None else None,
        )
    if variant != FP:
        d = rep.deltas.get(variant, {}).get(task)
        if d is not None:
            out.append(("delta_acc", d.delta, d.stderr, d.ci_low, d.ci_high))
            if math.isfinite(d.rel_drop):  # undefined when acc_fp = 0
                out.append(("rel_drop", d.rel_drop, None, d.rel_ci_low, d.rel_ci_high))
            extra.update(p_mcnemar=d.p, discordant_fp_right=d.b, discordant_q_right=d.c, n_boot=d.n_boot)
            fp_s = rep.scores[FP]
            extra["fp_acc"] = (
                rep.means[FP][0]
                if task == MEAN
                else (fp_s[task].acc if fp_s[task].acc is not None else fp_s[task].acc_norm)
            )
    return [m for m in out if m is not None], extra
