"""Task accuracy of one checkpoint, FP and quantized, from settings objects (``losslens accuracy``).

:func:`checkpoint_accuracy` opens the checkpoint and its tokenizer, quantizes it under each spec and
scores every variant on the same items through lm-evaluation-harness
(:func:`losslens.measure.accuracy.variants.task_accuracy`); it returns one JSON-ready record per
(variant, task) and per variant's mean, what ``losslens accuracy --json`` prints one per line.
:func:`accuracy` is the same with the CLI's options as keyword parameters (``losslens.accuracy``).
Imports torch and lm-eval only when called; needs the ``eval`` extra (``pip install 'losslens[eval]'``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from losslens.lm.shared_settings import SettingsError, keywords, settings


@settings
@dataclass(frozen=True)
class AccuracySettings:
    """What ``losslens accuracy`` measures: the tasks (lm-eval names, task YAML paths or folders,
    ``embedded``, ``seed-12``; comma-separated entries are split), the quantizer specs compared with
    FP (None: FP alone; GPTQ/AWQ are calibrated on the default calibration set), a seeded subsample of
    ``limit`` items per task (None: all), the few-shot examples (None: the preset's or the task's),
    the seed of the subsample and of the bootstrap, the paired bootstrap resamples of the Δacc
    intervals, sequences per forward pass, and the checkpoint's device (None: cpu), pickle
    permission, label and hub cache. ``quiet``: no progress lines on stderr (default: the variants
    scored / planned with an ETA, :mod:`losslens.geometry.base.progress`)."""

    tasks: list[str] = field(default_factory=lambda: ["embedded"])
    spec: Optional[list[str]] = None
    limit: Optional[int] = None
    num_fewshot: Optional[int] = None
    seed: int = 0
    n_boot: int = 2000
    batch_size: int = 32
    device: Optional[str] = None
    allow_pickle: bool = False
    label: Optional[str] = None
    cache_dir: Optional[Path] = None
    quiet: bool = False


def checkpoint_accuracy(checkpoint: str | Path, settings: AccuracySettings = AccuracySettings()) -> list[dict]:
    """One JSON-ready record per (variant, task) and per variant's mean (variant ``fp`` first, then
    the specs; what ``losslens accuracy --json`` prints, one per line): ``variant``, ``task``, ``n``,
    ``acc`` ± ``acc_stderr`` (fractions), ``acc_norm``, for a spec ``delta_acc`` = acc_q − acc_fp with
    its paired bootstrap 95% interval (``delta_ci_low`` / ``delta_ci_high``), ``rel_drop`` and McNemar's
    ``p_mcnemar``, plus ``checkpoint``, ``label`` and ``step``. A task that could not be loaded (its data
    not cached offline) or a quantizer that failed is a record with ``error`` (the others still run).

    Raises :class:`~losslens.measure.accuracy.selection.AccuracyError` without lm-eval or for a task
    entry that names nothing, :class:`SettingsError` (``"--spec: ..."``) for a bad spec, and the
    checkpoint loader's errors. Cost: (1 + len(spec)) × one forward per (item, choice) pair, plus each
    quantizer once (and the default token sets built once for a calibrated spec)."""
    from losslens.measure.accuracy.selection import AccuracyError

    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise AccuracyError("`losslens accuracy` needs lm-evaluation-harness: pip install 'losslens[eval]'") from None
    from losslens.geometry.base.jsonable import jsonable
    from losslens.lm.checkpoints import CheckpointLoader, open_checkpoint
    from losslens.lm.data import load_tokenizer
    from losslens.lm.quant import QuantizeError, QuantSpec
    from losslens.measure.accuracy.selection import select_tasks
    from losslens.measure.accuracy.variants import task_accuracy

    s = settings
    try:
        specs = [QuantSpec.parse(x) for x in (s.spec or [])]
    except QuantizeError as e:
        raise SettingsError(f"--spec: {e}") from None
    selection = select_tasks(s.tasks)
    traj, ref = open_checkpoint(checkpoint, s.label, cache_dir=s.cache_dir, alone=True)
    model = CheckpointLoader(traj, device=s.device, allow_pickle=s.allow_pickle).load(ref).eval()
    tok = load_tokenizer(ref)
    cal = None
    if any(q.needs_calibration for q in specs):
        from losslens.lm.data import default_token_sets

        cal = default_token_sets(traj)["calibration"]
    rep = task_accuracy(
        model,
        tok,
        selection,
        [str(q) for q in specs],
        calibration=cal,
        limit=s.limit,
        num_fewshot=s.num_fewshot,
        seed=s.seed,
        batch_size=s.batch_size,
        n_boot=s.n_boot,
        progress=not s.quiet,
    )
    records = rep.records()
    for r in records:
        r.update(checkpoint=str(checkpoint), label=ref.label, step=ref.step)
    return jsonable(records)


accuracy = keywords(
    checkpoint_accuracy,
    "accuracy",
    """``accuracy(checkpoint, *, tasks=["embedded"], spec=None, limit=None, num_fewshot=None, seed=0, ...)``:
    :func:`checkpoint_accuracy` with :class:`AccuracySettings`' fields as keyword parameters (named like
    ``losslens accuracy``'s options, with their defaults). ``checkpoint``: a checkpoint folder or weight
    file, a trajectory folder (``label``) or ``hf:ORG/NAME@REV``. Returns one record per (variant, task)
    and per variant's mean, the records ``losslens accuracy --json`` prints (a failed task: ``error``).""",
)

__all__ = ["AccuracySettings", "accuracy", "checkpoint_accuracy"]
