"""Trajectories: the ordered checkpoints of one training run (docs/science.md §6).

A :class:`Trajectory` is an ordered list of :class:`~losslens.lm.checkpoints.refs.CheckpointRef`. Sources:

- :meth:`Trajectory.from_folder` -- a folder of HF checkpoints named by step: ``step-1000``,
  ``step1000``, ``step_1000``, HF Trainer ``checkpoint-1000``, Megatron ``iter_0001000``, DeepSpeed
  ``global_step1000``, OLMo-style ``stage1-step1000-tokens4B`` (sub-folders with ``config.json`` and
  weights), or single weight files ``step1000.safetensors`` beside one shared ``config.json``. LR /
  tokens / losses come from ``trajectory.json`` (written by ``losslens train-tiny``) or HF
  Trainer's ``trainer_state.json`` (``log_history``). Listing never loads weights, so a corrupt
  checkpoint does not stop the others from being listed; :meth:`Trajectory.validate` reports it.
- :meth:`Trajectory.from_hub` -- a hub repo id plus a list of revisions or a glob over a list
  (Pythia ``step1000``, OLMo ``stage1-step...``), resolved through the local HF cache
  (:mod:`losslens.lm.checkpoints.hub`).
- :meth:`Trajectory.from_list` -- explicit refs or paths.

:func:`tokenizer_folder` finds the tokenizer files saved with a checkpoint or trajectory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from losslens.geometry.base.jsonable import jsonable

from losslens.lm.core.tokenset import TokenSet

from losslens.lm.checkpoints.derived import lawa
from losslens.lm.checkpoints.errors import (
    ArchitectureMismatchError,
    CheckpointError,
    CorruptCheckpointError,
    MissingWeightsError,
    NoCheckpointsError,
    RevisionNotCachedError,
    UnsafeCheckpointError,
)
from losslens.lm.checkpoints.files import (
    TRAINER_FILES,
    WEIGHT_SUFFIXES,
    file_shapes,
    has_tokenizer_files,
    local_folder,
    read_config,
    ref_weight_files,
)
from losslens.lm.checkpoints.hub import hub_revisions
from losslens.lm.checkpoints.records import apply_trainer_state, apply_trajectory_json, trainer_states
from losslens.lm.checkpoints.refs import CheckpointRef, name_tokens, parse_step
from losslens.lm.checkpoints.schedule import Schedule, apply_schedule, as_schedule, check_tokens_per_step, read_sidecar

__all__ = ["Trajectory", "CheckpointProblem", "tokenizer_folder"]


@dataclass(frozen=True)
class CheckpointProblem:
    """One problem found by :meth:`Trajectory.validate`: ``kind`` is missing | corrupt | unsafe |
    architecture | config | hub."""

    label: str
    location: str | None
    kind: str
    message: str


def _sort_key(ref: CheckpointRef) -> tuple:
    return (ref.step is None, ref.step if ref.step is not None else 0, ref.label)


class Trajectory:
    """An ordered list of :class:`CheckpointRef` of one training run.

    ``traj[i]`` / ``traj["step-000100"]`` / ``traj[1:3]``, ``len(traj)``, iteration in order.
    ``meta``: what was read alongside (trajectory.json content, folder, validation set path, ...).
    """

    def __init__(self, checkpoints: Iterable[CheckpointRef], name: str | None = None, meta: dict | None = None):
        self.checkpoints: list[CheckpointRef] = list(checkpoints)
        self.name: str = name or "trajectory"
        self.meta: dict = dict(meta or {})
        labels = [c.label for c in self.checkpoints]
        dup = {x for x in labels if labels.count(x) > 1}
        if dup:
            raise CheckpointError(f"trajectory {self.name!r}: duplicate checkpoint labels {sorted(dup)}")

    # container protocol --------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.checkpoints)

    def __iter__(self) -> Iterator[CheckpointRef]:
        return iter(self.checkpoints)

    def __getitem__(self, key: int | str | slice):
        if isinstance(key, slice):
            return Trajectory(self.checkpoints[key], self.name, self.meta)
        if isinstance(key, str):
            for c in self.checkpoints:
                if c.label == key:
                    return c
            raise KeyError(f"trajectory {self.name!r} has no checkpoint {key!r}; labels: {self.labels[:8]}")
        return self.checkpoints[key]

    def __repr__(self) -> str:
        steps = [c.step for c in self.checkpoints]
        return f"Trajectory({self.name!r}, {len(self)} checkpoints, steps={steps[:6]}{'...' if len(steps) > 6 else ''})"

    @property
    def labels(self) -> list[str]:
        return [c.label for c in self.checkpoints]

    @property
    def steps(self) -> list[int | None]:
        return [c.step for c in self.checkpoints]

    @property
    def real(self) -> list[CheckpointRef]:
        """The non-derived checkpoints."""
        return [c for c in self.checkpoints if not c.derived]

    @property
    def validation_set(self):
        """The :class:`~losslens.lm.core.tokenset.TokenSet` used for ``val_loss`` (train-tiny folders), or None."""
        path = self.meta.get("validation_set")
        if not path:
            return None
        return TokenSet.load(path)

    # sources -------------------------------------------------------------------------------
    @classmethod
    def from_folder(cls, path: str | Path, name: str | None = None) -> "Trajectory":
        """Discover the checkpoints in ``path`` (see module docstring), ordered by step.

        Reads only names and small JSON files; never weights. Raises :class:`NoCheckpointsError`
        when nothing checkpoint-like is there. A folder that itself is one checkpoint gives a
        one-checkpoint trajectory.
        """
        root = Path(path).expanduser()
        if not root.is_dir():
            raise NoCheckpointsError(
                f"{root} is not a folder; pass a folder of checkpoints (step-1000/, "
                "checkpoint-1000/, ...) or a checkpoint folder"
            )
        root = root.resolve()
        refs: list[CheckpointRef] = []
        for child in sorted(root.iterdir()):
            if child.is_dir():
                if parse_step(child.name) is not None:
                    refs.append(CheckpointRef.from_path(child))
            elif child.suffix in WEIGHT_SUFFIXES and child.name not in TRAINER_FILES:
                if parse_step(child.stem) is not None:
                    refs.append(CheckpointRef.from_path(child))
        meta: dict[str, Any] = {"folder": str(root)}
        tj = root / "trajectory.json"
        tj_data = None
        if tj.is_file():
            try:
                tj_data = json.loads(tj.read_text())
            except ValueError as exc:
                raise CorruptCheckpointError(f"{tj} is not valid JSON: {exc}") from exc
            if not refs:
                for entry in tj_data.get("checkpoints", []):
                    p = root / entry.get("path", "")
                    if entry.get("path"):
                        refs.append(CheckpointRef.from_path(p))
        if not refs:
            if (root / "config.json").is_file():
                return cls([CheckpointRef.from_path(root)], name or root.name, meta)
            raise NoCheckpointsError(
                f"no checkpoints in {root}: expected sub-folders named by step (step-1000, step1000, step_1000, "
                "checkpoint-1000, iter_0001000, ...) each with config.json and weights, files like "
                "step1000.safetensors, or a trajectory.json"
            )
        refs.sort(key=_sort_key)
        if tj_data is not None:
            refs = apply_trajectory_json(refs, tj_data, root)
            meta.update({k: v for k, v in tj_data.items() if k != "checkpoints"})
            if tj_data.get("validation_set"):
                meta["validation_set"] = str(root / tj_data["validation_set"])
            if tj_data.get("tokenizer"):
                meta["tokenizer_dir"] = str(root / tj_data["tokenizer"])
            name = name or tj_data.get("name")
        states = trainer_states(root, refs)
        if states:
            refs = apply_trainer_state(refs, states)
            meta["trainer_state"] = True
        if tj.is_file():  # "schedule" / "tokens_per_step": fill what trajectory.json and trainer_state.json lack
            sched, tps = read_sidecar(tj)
            refs = apply_schedule(refs, sched, tps, override=False)
            meta.update({k: v for k, v in (("schedule", sched and sched.spec), ("tokens_per_step", tps)) if v})
        return cls(name_tokens(refs), name or root.name, meta)

    @classmethod
    def from_hub(
        cls,
        repo_id: str,
        revisions: "Sequence[str] | str",
        cache_dir: str | Path | None = None,
        local_files_only: bool | None = None,
        available: Sequence[str] | None = None,
        name: str | None = None,
    ) -> "Trajectory":
        """Checkpoints ``repo_id@revision`` for each revision.

        ``revisions``: one item or a list of items; an item is a revision name (branch, tag or commit
        hash), a glob (``"step*"``, ``"stage1-step*"``) or ``"re:<regex>"`` (full match). Patterns are
        matched against ``available`` or, when that is not given, the repo's branches and tags
        (``huggingface_hub.list_repo_refs``; offline, or when the hub cannot be reached: the refs in the
        local cache, ``<cache>/models--org--name/refs``). With a pattern among the items the result is
        ordered by the step parsed from each name; a list of names keeps its order. A name is taken as
        given (not looked up), so a revision missing from the cache fails when it is loaded, with the
        command that downloads it. ``local_files_only=None`` follows ``HF_HUB_OFFLINE`` /
        ``TRANSFORMERS_OFFLINE`` at call time. No weights are downloaded here. Raises
        :class:`NoCheckpointsError` when a pattern matches no revision.
        """
        items = [revisions] if isinstance(revisions, str) else list(revisions)
        if not items:
            raise NoCheckpointsError(f"no revisions given for {repo_id}")
        revs, patterns = hub_revisions(repo_id, items, cache_dir, local_files_only, available)
        refs = name_tokens([CheckpointRef.from_hub(repo_id, r, cache_dir, local_files_only) for r in revs])
        if patterns:
            refs.sort(key=_sort_key)
        return cls(refs, name or repo_id, {"repo_id": repo_id, "cache_dir": str(cache_dir) if cache_dir else None})

    @classmethod
    def from_list(
        cls,
        items: Iterable["CheckpointRef | str | Path"],
        name: str | None = None,
        sort: bool = False,
        meta: dict | None = None,
    ) -> "Trajectory":
        """A trajectory from refs and/or paths (folders or weight files), in the given order
        (``sort=True`` orders by step)."""
        refs = [x if isinstance(x, CheckpointRef) else CheckpointRef.from_path(x) for x in items]
        if not refs:
            raise NoCheckpointsError("Trajectory.from_list got no checkpoints")
        if sort:
            refs.sort(key=_sort_key)
        return cls(refs, name, meta)

    @classmethod
    def open(cls, spec: str | Path, revisions: "Sequence[str] | str | None" = None, **kwargs: Any) -> "Trajectory":
        """A folder path -> :meth:`from_folder`; otherwise ``spec`` is a hub repo id and ``revisions``
        is required -> :meth:`from_hub`."""
        p = Path(spec).expanduser()
        if p.exists() or revisions is None:
            return cls.from_folder(p)
        return cls.from_hub(str(spec), revisions, **kwargs)

    # derived -------------------------------------------------------------------------------
    def with_lawa(
        self, k: int = 3, label: str | None = None, at: int | str | None = None, weights: Sequence[float] | None = None
    ) -> "Trajectory":
        """A new trajectory with a LAWA checkpoint appended: the (weighted) mean of the last ``k``
        real checkpoints up to and including ``at`` (label or index; default: the last one)."""
        real = self.real
        if at is None:
            end = len(real)
        else:
            target = self[at]
            end = next((i + 1 for i, c in enumerate(real) if c.label == target.label), None)
            if end is None:
                raise CheckpointError(f"LAWA end point {at!r} is not a real checkpoint of {self.name!r}")
        if k < 1 or k > end:
            raise CheckpointError(
                f"LAWA over k={k} checkpoints needs 1 <= k <= {end} (checkpoints up to the end point)"
            )
        ref = lawa(real[end - k : end], weights=weights, label=label)
        return Trajectory(self.checkpoints + [ref], self.name, self.meta)

    def with_schedule(
        self, schedule: "Schedule | str | None" = None, tokens_per_step: int | None = None, override: bool = True
    ) -> "Trajectory":
        """A new trajectory whose checkpoints' LR and tokens are derived from ``schedule`` (a
        :class:`~losslens.lm.checkpoints.schedule.Schedule`, a spec string or a preset name) and
        ``tokens_per_step`` (default: the schedule's), by step
        (:func:`~losslens.lm.checkpoints.schedule.apply_schedule`;
        ``override=False`` only fills missing values). The spec is kept in ``meta["schedule"]``."""
        sched = as_schedule(schedule)
        tps = check_tokens_per_step(tokens_per_step)
        refs = apply_schedule(self.checkpoints, sched, tps, override=override)
        meta = dict(self.meta)
        if sched is not None:
            meta["schedule"] = sched.spec
        if tps or (sched is not None and sched.tokens_per_step):
            meta["tokens_per_step"] = tps or sched.tokens_per_step
        return Trajectory(refs, self.name, meta)

    def only(self, ref: CheckpointRef) -> "Trajectory":
        """The one-checkpoint trajectory of ``ref`` with this one's name and meta (tokenizer folder,
        schedule): what a single-checkpoint command loads from, so that a hub pattern resolves only that
        revision. A hub revision is resolved here (read from the cache; downloaded when online), so a
        missing one fails first with :class:`RevisionNotCachedError` and the command that downloads it."""
        if ref.kind == "hub":
            local_folder(ref)
        return Trajectory([ref], self.name, self.meta)

    # checks --------------------------------------------------------------------------------
    def validate(self, check_weights: bool = True, raise_errors: bool = False) -> list[CheckpointProblem]:
        """Check every checkpoint: config present and readable, one ``model_type``, weight files
        present and readable (safetensors headers; torch files via weights_only load), parameter names
        and shapes equal to the first good checkpoint's. Returns the problems (empty = all good);
        ``raise_errors=True`` raises the first one instead. Cost: reads headers only for safetensors.
        """
        problems: list[CheckpointProblem] = []
        ref_type: tuple[str, str] | None = None
        ref_shapes: tuple[str, dict] | None = None
        for ref in self.checkpoints:
            if ref.derived:
                missing = [s.label for s in ref.sources if s.label not in self.labels]
                if not ref.sources:
                    problems.append(CheckpointProblem(ref.label, None, "config", "derived checkpoint without sources"))
                elif missing:
                    problems.append(
                        CheckpointProblem(
                            ref.label, None, "config", f"sources {missing} are not in this trajectory (still loadable)"
                        )
                    )
                continue
            try:
                cfg = read_config(ref)
                mt = str(cfg.get("model_type"))
                if ref_type is None:
                    ref_type = (mt, ref.label)
                elif mt != ref_type[0]:
                    raise ArchitectureMismatchError(
                        f"checkpoint {ref.label!r} is a {mt!r} model but {ref_type[1]!r} is a {ref_type[0]!r} model"
                    )
                if check_weights:
                    shapes = file_shapes(ref_weight_files(ref), ref.label)
                    if ref_shapes is None:
                        ref_shapes = (ref.label, shapes)
                    elif shapes != ref_shapes[1]:
                        diff = sorted(set(shapes.items()) ^ set(ref_shapes[1].items()))[:3]
                        raise ArchitectureMismatchError(
                            f"checkpoint {ref.label!r} has different parameter names/shapes "
                            f"than {ref_shapes[0]!r} (e.g. {diff})"
                        )
            except CheckpointError as exc:
                kind = {
                    MissingWeightsError: "missing",
                    CorruptCheckpointError: "corrupt",
                    UnsafeCheckpointError: "unsafe",
                    ArchitectureMismatchError: "architecture",
                    RevisionNotCachedError: "hub",
                }.get(type(exc), "config")
                if raise_errors:
                    raise
                problems.append(CheckpointProblem(ref.label, ref.location, kind, str(exc)))
        return problems

    # serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "meta": jsonable(self.meta, repr),
            "checkpoints": [c.to_dict() for c in self.checkpoints],
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Trajectory":
        return cls([CheckpointRef.from_dict(c) for c in d["checkpoints"]], d.get("name"), d.get("meta"))


def tokenizer_folder(obj: "CheckpointRef | Trajectory | str | Path") -> Path | None:
    """Folder holding the tokenizer files for a checkpoint, trajectory or folder (None if none)."""
    if isinstance(obj, CheckpointRef):
        try:
            folder = local_folder(obj)
        except CheckpointError:
            return None
        return (
            folder if has_tokenizer_files(folder) else (folder.parent if has_tokenizer_files(folder.parent) else None)
        )
    if isinstance(obj, Trajectory):
        tok = obj.meta.get("tokenizer_dir")
        if tok and has_tokenizer_files(Path(tok)):
            return Path(tok)
        for ref in obj.checkpoints:
            found = tokenizer_folder(ref)
            if found is not None:
                return found
        return None
    p = Path(obj)
    if p.is_dir() and has_tokenizer_files(p) and not (p / "trajectory.json").is_file():
        return p
    try:
        return tokenizer_folder(Trajectory.from_folder(p))
    except CheckpointError:
        return p if p.is_dir() and has_tokenizer_files(p) else None
