"""Which lm-evaluation-harness tasks to run: names, local YAML files or folders, and presets.

:func:`select_tasks` turns the user's ``--tasks`` entries into a :class:`TaskSelection`:

- an lm-eval task or group name (``arc_easy``, ``mmlu``): loaded from lm-eval's own task index
  (indexing it costs ~10 s, so it is built only when a name is not found locally);
- a path to a task YAML (``my_task.yaml``, e.g. ``dataset_path: json`` with ``data_files``) or to a
  folder of them (``include_path``: every task defined in the folder);
- ``embedded``: the offline task :data:`losslens.measure.accuracy.embedded.TASK_NAME` shipped with losslens;
- ``seed-12``: the seeds' twelve tasks (:data:`SEED_12`), 5-shot (:data:`SEED_12_FEWSHOT`). MMLU is
  **one** task of the twelve: its score is the mean over all of its items (lm-eval's size-weighted
  group mean), so the 12-task mean weighs MMLU like any other task.

Offline: lm-eval loads datasets with ``datasets``, which honours ``HF_DATASETS_OFFLINE=1``. A
task whose data is not in the local cache raises :class:`TaskUnavailable` with one line that says
how to cache it (:func:`load_tasks` loads each task separately, so one missing task never stops the
others).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from losslens.geometry.base.errors import LosslensError

from losslens.measure.accuracy.embedded import TASK_DIR, TASK_NAME

__all__ = [
    "AccuracyError",
    "TaskUnavailable",
    "TaskSelection",
    "select_tasks",
    "load_tasks",
    "SEED_12",
    "SEED_12_FEWSHOT",
    "PRESETS",
    "quiet_lm_eval",
]

SEED_12 = (
    "arc_challenge",
    "arc_easy",
    "openbookqa",
    "piqa",
    "hellaswag",
    "winogrande",
    "mathqa",
    "pubmedqa",
    "sciq",
    "social_iqa",
    "commonsense_qa",
    "mmlu",
)
"""The seeds' 12 tasks by lm-eval 0.4.13 name (SIQA is ``social_iqa``, CSQA ``commonsense_qa``;
``mmlu`` is the group of its 57 subjects, counted as one task)."""
SEED_12_FEWSHOT = 5
PRESETS = ("embedded", "seed-12")


class AccuracyError(LosslensError, ValueError):
    """Bad accuracy input (unknown task, missing lm-eval, a model without a tokenizer); the message says what to do."""


class TaskUnavailable(AccuracyError):
    """A task could not be loaded (its data is not cached while offline, or its YAML is broken)."""


@dataclass(frozen=True)
class TaskSelection:
    """The tasks to run: ``names`` (what lm-eval is asked for, in order; each one task of the mean),
    ``include_paths`` (folders lm-eval indexes besides its own), ``files`` (YAML paths by task name),
    ``fewshot`` (a per-task default few-shot count from a preset; None: the task's own),
    ``needs_defaults`` (some name is from lm-eval's own index)."""

    names: tuple[str, ...]
    include_paths: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()
    fewshot: tuple[tuple[str, int], ...] = ()
    needs_defaults: bool = False
    requested: tuple[str, ...] = field(default=())

    def spec_of(self, name: str) -> str:
        """What to hand lm-eval for task ``name``: its YAML path, or the name."""
        return dict(self.files).get(name, name)

    def task_manager(self):
        from lm_eval.tasks import TaskManager

        with quiet_lm_eval():
            return TaskManager(include_path=list(self.include_paths) or None, include_defaults=self.needs_defaults)


def _yaml_task_names(path: Path) -> list[str]:
    """``task:`` names defined in a YAML file (``!function`` and other tags tolerated)."""
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    _Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    except (OSError, yaml.YAMLError) as exc:
        raise AccuracyError(f"cannot read task file {path}: {exc}") from exc
    if not isinstance(data, dict):
        return []
    t = data.get("task")
    return [t] if isinstance(t, str) else []


def select_tasks(tasks: "str | list[str] | tuple[str, ...]") -> TaskSelection:
    """A :class:`TaskSelection` from task names, YAML paths, folders and presets (module docstring).
    Raises :class:`AccuracyError` for an empty list or a path that holds no task."""
    items = [tasks] if isinstance(tasks, str) else list(tasks)
    items = [t.strip() for item in items for t in str(item).split(",") if t.strip()]
    if not items:
        raise AccuracyError(
            "no task given; pass --tasks embedded, --tasks seed-12, lm-eval task names or task YAML paths"
        )
    names: list[str] = []
    include: list[str] = [str(TASK_DIR)]
    files: dict[str, str] = {}
    fewshot: dict[str, int] = {}
    needs_defaults = False
    for item in items:
        if item == "embedded":
            names.append(TASK_NAME)
        elif item == "seed-12":
            names.extend(SEED_12)
            fewshot.update({n: SEED_12_FEWSHOT for n in SEED_12})
            needs_defaults = True
        elif item.endswith((".yaml", ".yml")) or os.sep in item or Path(item).exists():
            p = Path(item).expanduser()
            if p.is_file():
                found = _yaml_task_names(p)
                if not found:
                    raise AccuracyError(f"{p} defines no 'task:'; a task YAML needs task, dataset and doc_to_* fields")
                names.extend(found)
                files.update({n: str(p.resolve()) for n in found})
                include.append(str(p.resolve().parent))
            elif p.is_dir():
                found = [n for f in sorted(p.rglob("*.y*ml")) for n in _yaml_task_names(f)]
                if not found:
                    raise AccuracyError(f"folder {p} holds no task YAML (no file with a 'task:' key)")
                names.extend(found)
                include.append(str(p.resolve()))
            else:
                raise AccuracyError(
                    f"task path {p} does not exist; pass a task YAML, a folder of them, a task name, "
                    f"or a preset ({', '.join(PRESETS)})"
                )
        else:
            names.append(item)
            needs_defaults = needs_defaults or item != TASK_NAME
    names = list(dict.fromkeys(names))
    return TaskSelection(
        tuple(names),
        tuple(dict.fromkeys(include)),
        tuple(sorted(files.items())),
        tuple(sorted(fewshot.items())),
        needs_defaults,
        tuple(items),
    )


class quiet_lm_eval:
    """lm-eval's loggers at ERROR and its tqdm bars off for a while (restored after). lm-eval logs a
    warning per call for a model passed as an object, and draws three bars per task and model
    (the ``tqdm`` names of its task, model and HF modules are swapped for a disabled one)."""

    _MODULES = ("lm_eval.api.task", "lm_eval.api.model", "lm_eval.models.huggingface")

    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def __enter__(self):
        if self.enabled:
            import functools
            import importlib

            self._levels = {n: logging.getLogger(n).level for n in ("lm_eval", "lm-eval")}
            for n in self._levels:
                logging.getLogger(n).setLevel(logging.ERROR)
            self._bars = []
            for name in self._MODULES:
                mod = importlib.import_module(name)
                orig = getattr(mod, "tqdm", None)
                if orig is not None:
                    self._bars.append((mod, orig))
                    mod.tqdm = functools.partial(_no_bar, orig)
        return self

    def __exit__(self, *exc):
        if self.enabled:
            for n, lvl in self._levels.items():
                logging.getLogger(n).setLevel(lvl)
            for mod, orig in self._bars:
                mod.tqdm = orig
        return False


def _no_bar(orig, *args, **kwargs):
    return orig(*args, **{**kwargs, "disable": True})


def _cache_hint(name: str) -> str:
    return (
        f'cache it once while online: HF_DATASETS_OFFLINE=0 python -c "from lm_eval.tasks import TaskManager; '
        f"TaskManager().load(['{name}'])\""
    )


def load_tasks(selection: TaskSelection, manager=None) -> dict[str, "object | TaskUnavailable"]:
    """``{name: lm-eval Task or Group object | TaskUnavailable}``, each task loaded on its own
    (its dataset read from the local cache; offline when ``HF_DATASETS_OFFLINE=1``)."""
    manager = manager if manager is not None else selection.task_manager()
    offline = os.environ.get("HF_DATASETS_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    out: dict[str, object] = {}
    for name in selection.names:
        spec = selection.spec_of(name)
        try:
            with quiet_lm_eval():
                loaded = manager.load([spec])
        except KeyError:
            out[name] = TaskUnavailable(
                f"task {name!r} is neither an lm-eval task/group name nor a task YAML; "
                "list lm-eval's tasks with `lm-eval ls tasks`"
            )
            continue
        except Exception as exc:  # datasets raises ConnectionError, FileNotFoundError, DatasetNotFoundError, ...
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            why = (
                "its dataset is not in the local cache (HF_DATASETS_OFFLINE=1)"
                if offline
                else "its dataset could not be loaded"
            )
            out[name] = TaskUnavailable(f"task {name!r}: {why} ({type(exc).__name__}: {first}); {_cache_hint(name)}")
            continue
        top = loaded["groups"].get(name) or loaded["tasks"].get(name)
        if top is None:  # a YAML path: lm-eval keys it by its task name
            top = next(iter(loaded["groups"].values()), None) or next(iter(loaded["tasks"].values()))
        out[name] = (top, loaded)
    return out
