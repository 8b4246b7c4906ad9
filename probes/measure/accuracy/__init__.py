"""Task accuracy under quantization, through lm-evaluation-harness (docs/science.md §6, issue #28).

    from losslens.measure.accuracy import task_accuracy
    rep = task_accuracy(model, tokenizer, tasks="embedded", specs=["rtn:4:g128"], limit=200)
    rep.records()        # acc, stderr, n per task and mean; Δacc and relative drop with paired CIs

Modules:

- :mod:`.embedded`  -- the offline task ``losslens_pydoc_mc`` (held-out corpus, 4 choices, 64 tokens)
  and its lm-eval task folder ``tasks/losslens_pydoc_mc``; :func:`~.embedded.export_task`;
- :mod:`.selection` -- ``--tasks`` entries (names, YAML paths/folders, ``embedded``, ``seed-12``),
  loading each task with a one-line error when its data is not cached offline;
- :mod:`.harness`   -- ``HFLM(pretrained=model, tokenizer=tok)`` + lm-eval's ``evaluate``, per-item
  outcomes, seeded subsamples;
- :mod:`.stats`     -- mean ± stderr, paired bootstrap and McNemar for Δacc;
- :mod:`.variants`  -- :func:`task_accuracy` (FP and quantized variants) and :class:`AccuracyReport`.

Needs the ``eval`` extra (``pip install 'losslens[eval]'``: lm-eval, pinned).
"""

from losslens.measure.accuracy.variants import (
    FP,
    MEAN,
    AccuracyReport,
    evaluate_variants,
    fill_statistics,
    task_accuracy,
)
from losslens.measure.accuracy.embedded import (
    TASK_DIR,
    TASK_NAME,
    build_items,
    embedded_items,
    export_task,
    length_baselines,
)
from losslens.measure.accuracy.harness import TaskScore, prepare_tasks, score_model, subsample
from losslens.measure.accuracy.selection import (
    PRESETS,
    SEED_12,
    SEED_12_FEWSHOT,
    AccuracyError,
    TaskSelection,
    TaskUnavailable,
    load_tasks,
    select_tasks,
)
from losslens.measure.accuracy.stats import PairedDelta, macro_mean, mcnemar_p, mean_stderr, paired_delta

__all__ = [
    "task_accuracy",
    "evaluate_variants",
    "fill_statistics",
    "AccuracyReport",
    "FP",
    "MEAN",
    "TASK_NAME",
    "TASK_DIR",
    "build_items",
    "embedded_items",
    "export_task",
    "length_baselines",
    "TaskScore",
    "prepare_tasks",
    "score_model",
    "subsample",
    "PRESETS",
    "SEED_12",
    "SEED_12_FEWSHOT",
    "AccuracyError",
    "TaskSelection",
    "TaskUnavailable",
    "load_tasks",
    "select_tasks",
    "PairedDelta",
    "macro_mean",
    "mcnemar_p",
    "mean_stderr",
    "paired_delta",
]
