"""One model, many tasks: lm-evaluation-harness on an in-memory model, scores per item.

:func:`score_model` wraps the model and its tokenizer in lm-eval's ``HFLM(pretrained=model,
tokenizer=tok)`` -- no reload from disk or hub; the model keeps its device and dtype (a half-precision
model gets its log-softmax in float32, as :func:`losslens.lm.core.next_token_loss.lm_loss` does) -- and calls
``lm_eval.evaluator.evaluate``, the core of ``simple_evaluate`` without its global RNG seeding and
its ~1.5 s per call of environment logging (it runs ``pip list``), with ``log_samples=True``; the
tasks' few-shot samplers are seeded with ``FEWSHOT_SEED``, ``simple_evaluate``'s default. From the logged samples it
keeps, per task, the per-item outcomes (``acc``; ``acc_norm`` where the task has it), so that two models scored on
the same items can be compared item by item (:mod:`.stats`).

- **Subsample** (``limit``): per leaf task, ``limit`` item indices drawn without replacement by
  ``random.Random`` seeded with SHA-256 of ``(seed, task name)``, then sorted -- not lm-eval's first
  N; the indices are passed as ``samples=`` and recorded (:attr:`TaskScore.doc_ids`).
- **Groups** (``mmlu``): one task whose items are all of its leaf tasks' items, so its score is the
  size-weighted mean over its subjects (what lm-eval reports for the group).
- **Few-shot**: ``num_fewshot`` for every task whose YAML does not fix 0 (lm-eval's rule); else a
  preset's value (seed-12: 5); else the task's own. Recorded per task.
- The model's train/eval modes are restored afterwards (HFLM puts it in eval mode).

Cost: one forward per (item, choice) pair in batches of ``batch_size`` sequences (lm-eval groups
requests sharing a context only for one-token continuations); measured rates in benchmarks/README.md.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from losslens.measure.accuracy.selection import AccuracyError, TaskSelection, TaskUnavailable, load_tasks, quiet_lm_eval
from losslens.measure.accuracy.stats import mean_stderr

__all__ = ["TaskScore", "score_model", "subsample", "prepare_tasks", "prepared_once"]

_PREPARED: dict = {}
#: Seed of the tasks' few-shot samplers (``simple_evaluate``'s default).
FEWSHOT_SEED = 1234
"""Seed of the few-shot sampler of every task (lm-eval's ``simple_evaluate`` default)."""


@dataclass
class TaskScore:
    """One task scored on one model.

    ``acc`` / ``acc_norm`` (None when the task has no such metric) are means over the ``n`` items
    with standard errors; ``headline`` names the one figures use (``acc``, or ``acc_norm`` where
    ``acc`` is missing). ``items``: item keys ``"leaf:doc_id"`` in a fixed order; ``correct`` /
    ``correct_norm``: the per-item outcomes [n] in that order. ``loglik``: per item, the
    log-likelihood of each choice (lm-eval's ``filtered_resps``) and ``arguments`` its
    ``(context, continuation)`` pairs -- kept only with ``keep_samples``. ``doc_ids``: the scored
    indices per leaf task (the subsample when ``limit`` was given). ``n_truncated``: items with a
    choice whose context + continuation exceeds the model's context by more than one token (lm-eval
    then drops tokens from the left; its warning is silenced here, so they are counted).
    """

    task: str
    n: int
    acc: float | None
    acc_stderr: float | None
    acc_norm: float | None
    acc_norm_stderr: float | None
    items: tuple[str, ...]
    correct: np.ndarray | None
    correct_norm: np.ndarray | None
    num_fewshot: dict[str, int]
    limit: int | None
    seed: int
    doc_ids: dict[str, list[int]] = field(default_factory=dict)
    version: dict[str, Any] = field(default_factory=dict)
    loglik: list | None = None
    arguments: list | None = None
    n_truncated: int = 0

    @property
    def headline(self) -> str:
        return "acc" if self.acc is not None else "acc_norm"

    def outcomes(self, metric: str | None = None) -> np.ndarray:
        """Per-item 0/1 outcomes of ``metric`` (default :attr:`headline`)."""
        m = metric or self.headline
        out = self.correct if m == "acc" else self.correct_norm
        if out is None:
            raise AccuracyError(f"task {self.task!r} has no {m!r} metric")
        return out

    def summary(self) -> dict:
        return {
            "task": self.task,
            "n": self.n,
            "acc": self.acc,
            "acc_stderr": self.acc_stderr,
            "acc_norm": self.acc_norm,
            "acc_norm_stderr": self.acc_norm_stderr,
            "headline": self.headline,
            "num_fewshot": self.num_fewshot,
            "limit": self.limit,
            "seed": self.seed,
            "version": self.version,
            "n_truncated": self.n_truncated,
        }


def subsample(n_docs: int, limit: int | None, seed: int, task: str) -> list[int] | None:
    """Sorted indices of a seeded random subsample of ``limit`` of ``n_docs`` items (None: all)."""
    if limit is None or limit >= n_docs:
        return None
    if limit < 1:
        raise AccuracyError(f"limit must be a positive number of items, got {limit}")
    rng = random.Random(int(hashlib.sha256(f"{seed}\0{task}".encode()).hexdigest()[:16], 16))
    return sorted(rng.sample(range(n_docs), int(limit)))


def _leaves(top, loaded) -> dict[str, Any]:
    return dict(loaded["tasks"])


def prepare_tasks(
    selection: TaskSelection, limit: int | None = None, num_fewshot: int | None = None, seed: int = 0, manager=None
) -> dict[str, Any]:
    """Load every selected task once (reusable for several models): ``{name: prepared | TaskUnavailable}``,
    each prepared entry holding the top object, its leaves, their few-shot counts and subsamples."""
    out: dict[str, Any] = {}
    fewshot = dict(selection.fewshot)
    manager = manager if manager is not None else selection.task_manager()
    for name, got in load_tasks(selection, manager).items():
        if isinstance(got, TaskUnavailable):
            out[name] = got
            continue
        top, loaded = got
        leaves = _leaves(top, loaded)
        shots, samples, sizes = {}, {}, {}
        for leaf, task in leaves.items():
            own = task.get_config("num_fewshot")
            k = (
                own
                if own == 0
                else num_fewshot
                if num_fewshot is not None
                else fewshot.get(name, own if own is not None else 0)
            )
            task.set_config(key="num_fewshot", value=int(k))
            task.set_fewshot_seed(seed=FEWSHOT_SEED)
            shots[leaf] = int(k)
            sizes[leaf] = len(task.eval_docs)
            idx = subsample(sizes[leaf], limit, seed, leaf)
            if idx is not None:
                samples[leaf] = idx
        version = {leaf: (task.get_config("metadata") or {}).get("version") for leaf, task in leaves.items()}
        out[name] = {
            "top": top,
            "leaves": leaves,
            "fewshot": shots,
            "samples": samples,
            "sizes": sizes,
            "version": version,
            "loaded": loaded,
        }
    return out


def prepared_once(
    selection: TaskSelection, limit: int | None = None, num_fewshot: int | None = None, seed: int = 0
) -> dict[str, Any]:
    """:func:`prepare_tasks`, kept per process for the last settings (a sweep scores every
    checkpoint on the same loaded tasks; lm-eval's own task index costs ~10 s to build)."""
    key = (selection, limit, num_fewshot, seed)
    if key not in _PREPARED:
        _PREPARED.clear()
        _PREPARED[key] = prepare_tasks(selection, limit, num_fewshot, seed)
    return _PREPARED[key]


def _score(
    name: str,
    prep: Mapping[str, Any],
    samples: Mapping[str, list],
    limit,
    seed,
    keep: bool,
    tokenizer=None,
    max_length: int | None = None,
) -> TaskScore:
    keys, acc, accn, ll, args = [], [], [], [], []
    truncated = 0
    has_norm = True
    doc_ids: dict[str, list[int]] = {}
    for leaf in sorted(prep["leaves"]):
        rows = sorted(samples.get(leaf, []), key=lambda s: s["doc_id"])
        if not rows:
            raise AccuracyError(f"lm-eval logged no samples for task {leaf!r}")
        if "acc" not in rows[0] and "acc_norm" not in rows[0]:
            raise AccuracyError(
                f"task {leaf!r} reports neither acc nor acc_norm (metrics: {sorted(rows[0].get('metrics', []))}); "
                "only multiple-choice tasks are supported"
            )
        doc_ids[leaf] = [int(s["doc_id"]) for s in rows]
        for s in rows:
            keys.append(f"{leaf}:{s['doc_id']}")
            acc.append(float(s.get("acc", np.nan)))
            has_norm = has_norm and "acc_norm" in s
            accn.append(float(s.get("acc_norm", np.nan)))
            if tokenizer is not None and max_length is not None:
                truncated += any(len(tokenizer.encode(c + x)) > max_length + 1 for c, x in s["arguments"])
            if keep:
                ll.append([float(r[0]) for r in s["filtered_resps"]])
                args.append([tuple(a) for a in s["arguments"]])
    a = np.asarray(acc)
    have_acc = not np.isnan(a).any()
    an = np.asarray(accn) if has_norm else None
    m, se = mean_stderr(a) if have_acc else (None, None)
    mn, sen = mean_stderr(an) if an is not None else (None, None)
    return TaskScore(
        task=name,
        n=len(keys),
        acc=m,
        acc_stderr=se,
        acc_norm=mn,
        acc_norm_stderr=sen,
        items=tuple(keys),
        correct=a.astype(bool) if have_acc else None,
        correct_norm=an.astype(bool) if an is not None else None,
        num_fewshot=dict(prep["fewshot"]),
        limit=limit,
        seed=seed,
        doc_ids=doc_ids,
        version={k: v for k, v in prep["version"].items() if v is not None},
        loglik=ll if keep else None,
        arguments=args if keep else None,
        n_truncated=int(truncated),
    )


def score_model(
    model,
    tokenizer,
    prepared: Mapping[str, Any],
    batch_size: int = 32,
    limit: int | None = None,
    seed: int = 0,
    keep_samples: bool = False,
    progress: bool = False,
) -> dict[str, "TaskScore | TaskUnavailable"]:
    """Score ``model`` on every prepared task (:func:`prepare_tasks`) in one lm-eval ``evaluate`` call.

    ``tokenizer``: the model's tokenizer object (a ``transformers`` tokenizer; offline it cannot be
    loaded by name). Returns ``{name: TaskScore}`` (or the task's :class:`TaskUnavailable`).
    Memory: the model plus one batch of ``batch_size`` × context activations.
    """
    import torch
    from lm_eval.evaluator import evaluate
    from lm_eval.models.huggingface import HFLM

    from losslens.geometry.base.modes import module_modes

    if tokenizer is None or not hasattr(tokenizer, "encode"):
        raise AccuracyError(
            "accuracy needs the model's transformers tokenizer object (offline it cannot be loaded by name)"
        )
    ready = {n: p for n, p in prepared.items() if not isinstance(p, TaskUnavailable)}
    out: dict[str, Any] = {n: p for n, p in prepared.items() if isinstance(p, TaskUnavailable)}
    if not ready:
        return out
    dtype = next(model.parameters()).dtype
    softmax = torch.float32 if dtype in (torch.float16, torch.bfloat16) else None
    samples = {leaf: idx for p in ready.values() for leaf, idx in p["samples"].items()}
    task_dict: dict[str, dict] = {"tasks": {}, "groups": {}, "group_map": {}}
    for p in ready.values():
        for k in task_dict:
            task_dict[k].update(p["loaded"].get(k) or {})
    with module_modes(model, training=False), quiet_lm_eval(not progress), torch.no_grad():
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=int(batch_size), softmax_dtype=softmax)
        res = evaluate(lm=lm, task_dict=task_dict, samples=samples or None, log_samples=True, bootstrap_iters=0)
    logged = res.get("samples") or {}
    for name, prep in ready.items():
        out[name] = _score(name, prep, logged, limit, seed, keep_samples, tokenizer, lm.max_length)
    return {n: out[n] for n in prepared}
