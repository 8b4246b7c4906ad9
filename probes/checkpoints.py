"""Checkpoints, trajectories, safe loading and derived (LAWA / soup) checkpoints (SCIENCE.md §6).

A :class:`Trajectory` is an ordered list of :class:`CheckpointRef` -- references (label, step,
tokens seen, learning rate when known, where the weights are), not loaded models. Sources:

- :meth:`Trajectory.from_folder` -- a folder of HF checkpoints named by step: ``step-1000``,
  ``step1000``, ``step_1000``, HF Trainer ``checkpoint-1000``, Megatron ``iter_0001000``, DeepSpeed
  ``global_step1000``, OLMo-style ``stage1-step1000-tokens4B`` (sub-folders with ``config.json`` and
  weights), or single weight files ``step1000.safetensors`` beside one shared ``config.json``. LR /
  tokens / losses come from ``trajectory.json`` (written by ``losslens train-tiny``) or HF
  Trainer's ``trainer_state.json`` (``log_history``). Listing never loads weights, so a corrupt
  checkpoint does not stop the others from being listed; :meth:`Trajectory.validate` reports it.
- :meth:`Trajectory.from_hub` -- a hub repo id plus a list of revisions or a glob over a list
  (Pythia ``step1000``, OLMo ``stage1-step...``). Files are resolved with
  ``huggingface_hub.snapshot_download(repo_id, revision=...)`` -- the same cached files
  ``from_pretrained(repo_id, revision=...)`` uses -- and work offline (``HF_HUB_OFFLINE=1`` or
  ``local_files_only=True``) from the local HF cache.
- :meth:`Trajectory.from_list` -- explicit refs or paths.

Loading (:class:`CheckpointLoader`) builds **one** model from the first loaded checkpoint's config
and copies each later checkpoint's weights into it (``Tensor.copy_``), after checking that the
config's ``model_type`` and every parameter name and shape agree. Weights are read with
``safetensors``; ``.bin`` / ``.pt`` files only with ``torch.load(weights_only=True)``; a file that
needs arbitrary pickle is refused unless ``allow_pickle=True``.

Derived checkpoints (:func:`lawa`) are weighted means of listed checkpoints computed at load time
(float64 accumulation, cast back to the sources' dtype); their step / tokens / LR are those of their
last source and ``kind == "derived"``.
"""
from __future__ import annotations

import fnmatch
import json
import os
import pickle
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import torch
from torch import nn

__all__ = [
    "CheckpointError",
    "NoCheckpointsError",
    "MissingWeightsError",
    "CorruptCheckpointError",
    "UnsafeCheckpointError",
    "ArchitectureMismatchError",
    "RevisionNotCachedError",
    "CheckpointRef",
    "CheckpointProblem",
    "Trajectory",
    "CheckpointLoader",
    "load_model",
    "lawa",
    "parse_step",
    "weight_files",
    "read_config",
    "local_folder",
    "tokenizer_folder",
]


# --------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------

class CheckpointError(RuntimeError):
    """Base class: a checkpoint or trajectory could not be found, read or used."""


class NoCheckpointsError(CheckpointError):
    """A folder / hub pattern yielded no checkpoints."""


class MissingWeightsError(CheckpointError, FileNotFoundError):
    """A checkpoint's weight or config file does not exist."""


class CorruptCheckpointError(CheckpointError):
    """A weight file exists but cannot be parsed."""


class UnsafeCheckpointError(CheckpointError):
    """A torch file needs arbitrary pickle to load and ``allow_pickle`` was not given."""


class ArchitectureMismatchError(CheckpointError):
    """Checkpoints of different architectures were mixed in one trajectory / loader / average."""


class RevisionNotCachedError(CheckpointError):
    """A hub revision is not in the local cache while offline."""


# --------------------------------------------------------------------------------------------
# references
# --------------------------------------------------------------------------------------------

KINDS = ("hf_dir", "safetensors", "torch_file", "hub", "derived")


@dataclass(frozen=True)
class CheckpointRef:
    """A reference to one checkpoint (no weights are loaded).

    ``kind``: "hf_dir" (folder with config.json + weights), "safetensors" (a single weight file;
    config.json next to it), "torch_file" (a single .bin/.pt file; config.json next to it), "hub"
    (``location`` = repo id, ``revision``), "derived" (weighted mean of ``meta["sources"]``).
    ``tokens``: training tokens seen at this checkpoint (None when unknown). ``lr``: learning rate of
    the last optimizer update before this checkpoint (None when unknown). ``meta`` holds anything
    else read alongside (train/val loss, hub cache_dir, ...) and is excluded from equality/hash.
    """

    label: str
    step: int | None = None
    tokens: int | None = None
    lr: float | None = None
    location: str | None = None
    kind: str = "hf_dir"
    revision: str | None = None
    derived_from: tuple[str, ...] = ()
    weights: tuple[float, ...] | None = None
    meta: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def derived(self) -> bool:
        return self.kind == "derived"

    @property
    def sources(self) -> tuple["CheckpointRef", ...]:
        """The source checkpoints of a derived checkpoint (empty for real ones)."""
        return tuple(self.meta.get("sources", ()))

    @classmethod
    def from_path(cls, path: str | Path, step: int | None = None, tokens: int | None = None, lr: float | None = None,
                  label: str | None = None, **meta: Any) -> "CheckpointRef":
        """A ref for a checkpoint folder or a single weight file; ``step`` parsed from the name if not given."""
        p = Path(path).expanduser()
        name = p.name if p.is_dir() or not p.suffix else p.stem
        if step is None:
            step = parse_step(name)
        if tokens is None and "tokens_from_name" not in meta:
            tk = _parse_tokens(name)
            if tk is not None:
                meta["tokens_from_name"] = tk
        if p.suffix in (".safetensors",):
            kind = "safetensors"
        elif p.suffix in (".bin", ".pt", ".pth"):
            kind = "torch_file"
        else:
            kind = "hf_dir"
        return cls(label or name, step, tokens, lr, str(p.resolve()) if p.exists() else str(p), kind, meta=meta)

    @classmethod
    def from_hub(cls, repo_id: str, revision: str, cache_dir: str | Path | None = None,
                 local_files_only: bool | None = None, label: str | None = None, step: int | None = None,
                 tokens: int | None = None, lr: float | None = None) -> "CheckpointRef":
        meta: dict[str, Any] = {"cache_dir": str(cache_dir) if cache_dir else None, "local_files_only": local_files_only}
        tk = _parse_tokens(revision)
        if tk is not None:
            meta["tokens_from_name"] = tk
        return cls(label or revision, parse_step(revision) if step is None else step, tokens, lr, repo_id, "hub",
                   revision, meta=meta)

    def replace(self, **changes: Any) -> "CheckpointRef":
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d.update(changes)
        return CheckpointRef(**d)

    def to_dict(self) -> dict:
        """JSON-able dict (derived sources serialised recursively)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "meta"}
        d["derived_from"] = list(self.derived_from)
        d["weights"] = list(self.weights) if self.weights is not None else None
        meta = {k: v for k, v in self.meta.items() if k != "sources"}
        if self.sources:
            meta["sources"] = [s.to_dict() for s in self.sources]
        d["meta"] = _jsonable(meta)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "CheckpointRef":
        d = dict(d)
        meta = dict(d.pop("meta", {}) or {})
        if "sources" in meta:
            meta["sources"] = tuple(cls.from_dict(s) for s in meta["sources"])
        d["derived_from"] = tuple(d.get("derived_from") or ())
        d["weights"] = tuple(d["weights"]) if d.get("weights") is not None else None
        return cls(**d, meta=meta)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, CheckpointRef):
        return x.to_dict()
    return repr(x)


_STEP_RE = re.compile(r"(?:^|[-_.])(?:global[-_]?step|step|checkpoint|ckpt|iter(?:ation)?)[-_]?(\d+)(?=$|[-_.])",
                      re.IGNORECASE)
_TOKENS_RE = re.compile(r"tokens[-_]?(\d+(?:\.\d+)?)([KMBT]?)(?=$|[-_.])", re.IGNORECASE)


def parse_step(name: str) -> int | None:
    """Training step from a checkpoint name: ``step-1000``, ``step1000``, ``step_1000``,
    ``checkpoint-1000``, ``iter_0001000``, ``global_step1000``, ``stage1-step1000-tokens4B`` -> 1000."""
    m = _STEP_RE.search(name)
    return int(m.group(1)) if m else None


def _parse_tokens(name: str) -> int | None:
    m = _TOKENS_RE.search(name)
    if not m:
        return None
    mult = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}[m.group(2).upper()]
    return int(round(float(m.group(1)) * mult))


# --------------------------------------------------------------------------------------------
# files
# --------------------------------------------------------------------------------------------

_TRAINER_FILES = {"optimizer.pt", "scheduler.pt", "training_args.bin", "rng_state.pth", "training_state.pt",
                  "optimizer.bin", "scaler.pt"}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def _offline() -> bool:
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in ("1", "ON", "YES", "TRUE"):
            return True
    return False


def _hub_cache_dir(cache_dir: str | Path | None) -> Path:
    if cache_dir:
        return Path(cache_dir).expanduser()
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _hub_folder(ref: CheckpointRef) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    lfo = ref.meta.get("local_files_only")
    offline = _offline() if lfo is None else bool(lfo)
    cache_dir = ref.meta.get("cache_dir")
    try:
        # like from_pretrained: safetensors when the revision has them, pytorch_model*.bin otherwise
        folder = snapshot_download(ref.location, revision=ref.revision, cache_dir=cache_dir, local_files_only=offline,
                                   allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"])
        if not offline and not any(Path(folder).glob("*.safetensors")):
            folder = snapshot_download(ref.location, revision=ref.revision, cache_dir=cache_dir,
                                       allow_patterns=["*.json", "pytorch_model*.bin"])
    except LocalEntryNotFoundError as exc:
        where = _hub_cache_dir(cache_dir)
        if offline:
            raise RevisionNotCachedError(
                f"checkpoint {ref.label!r}: revision {ref.revision!r} of {ref.location} is not in the local Hugging Face "
                f"cache ({where}) and offline mode is on (HF_HUB_OFFLINE=1 or local_files_only=True). Download it first "
                f"(`hf download {ref.location} --revision {ref.revision}`), or unset offline mode to let it be "
                "downloaded.") from exc
        raise RevisionNotCachedError(
            f"checkpoint {ref.label!r}: revision {ref.revision!r} of {ref.location} could not be downloaded and is not "
            f"in the local cache ({where}): {exc}") from exc
    except Exception as exc:  # RepositoryNotFound, RevisionNotFound, network errors
        raise CheckpointError(f"checkpoint {ref.label!r}: cannot resolve {ref.location}@{ref.revision}: {exc}") from exc
    return Path(folder)


def local_folder(ref: CheckpointRef) -> Path:
    """The local folder holding ``ref``'s config.json (hub refs resolved through the HF cache)."""
    if ref.kind == "hub":
        return _hub_folder(ref)
    if ref.kind == "derived":
        if not ref.sources:
            raise CheckpointError(f"derived checkpoint {ref.label!r} has no sources")
        return local_folder(ref.sources[0])
    if ref.location is None:
        raise CheckpointError(f"checkpoint {ref.label!r} has no location")
    p = Path(ref.location)
    return p if ref.kind == "hf_dir" else p.parent


def weight_files(folder: str | Path, label: str | None = None) -> list[Path]:
    """Weight files of an HF checkpoint folder, in the order ``from_pretrained`` prefers:
    model.safetensors, its sharded index, pytorch_model.bin, its index, then a single other
    .safetensors / .bin / .pt file (HF Trainer's optimizer.pt, training_args.bin ... are ignored).
    Raises :class:`MissingWeightsError` naming the folder (or a missing shard)."""
    folder = Path(folder)
    name = label or folder.name
    if not folder.is_dir():
        raise MissingWeightsError(f"checkpoint {name!r}: folder {folder} does not exist")
    for single, index in (("model.safetensors", "model.safetensors.index.json"),
                          ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        if (folder / single).is_file():
            return [folder / single]
        if (folder / index).is_file():
            try:
                wm = json.loads((folder / index).read_text())["weight_map"]
            except (ValueError, KeyError) as exc:
                raise CorruptCheckpointError(f"checkpoint {name!r}: shard index {folder / index} is unreadable: {exc}") from exc
            shards = [folder / s for s in sorted(set(wm.values()))]
            for s in shards:
                if not s.is_file():
                    raise MissingWeightsError(f"checkpoint {name!r}: shard {s} listed in {index} is missing")
            return shards
    others = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in _WEIGHT_SUFFIXES
                    and p.name not in _TRAINER_FILES and not p.name.startswith("rng_state"))
    sts = [p for p in others if p.suffix == ".safetensors"]
    if len(sts) == 1:
        return sts
    if not sts and len(others) == 1:
        return others
    if len(others) > 1:
        raise MissingWeightsError(f"checkpoint {name!r}: {folder} holds several weight files "
                                  f"({', '.join(p.name for p in others)}) and no model.safetensors / index to say which to use")
    raise MissingWeightsError(f"checkpoint {name!r}: no weight file in {folder} (expected model.safetensors, "
                              "model.safetensors.index.json or pytorch_model.bin)")


def _ref_weight_files(ref: CheckpointRef) -> list[Path]:
    if ref.kind in ("safetensors", "torch_file"):
        p = Path(ref.location or "")
        if not p.is_file():
            raise MissingWeightsError(f"checkpoint {ref.label!r}: weight file {p} does not exist")
        return [p]
    return weight_files(local_folder(ref), ref.label)


def read_config(ref_or_path: "CheckpointRef | str | Path") -> dict:
    """The checkpoint's config.json as a dict (cheap: no weights read).

    Raises :class:`MissingWeightsError` when there is no config.json, :class:`CorruptCheckpointError`
    when it is not JSON."""
    if isinstance(ref_or_path, CheckpointRef):
        folder, label = local_folder(ref_or_path), ref_or_path.label
    else:
        p = Path(ref_or_path)
        folder, label = (p if p.is_dir() else p.parent), p.name
    path = folder / "config.json"
    if not path.is_file():
        raise MissingWeightsError(f"checkpoint {label!r}: no config.json in {folder}; an HF checkpoint needs one "
                                  "(model.config.save_pretrained(folder))")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise CorruptCheckpointError(f"checkpoint {label!r}: {path} is not valid JSON: {exc}") from exc


def _load_weight_file(path: Path, allow_pickle: bool = False, label: str | None = None) -> dict[str, torch.Tensor]:
    """One weight file -> state dict of CPU tensors. safetensors, or torch.load(weights_only=True)."""
    who = f"checkpoint {label!r}: " if label else ""
    if not path.is_file():
        raise MissingWeightsError(f"{who}weight file {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device="cpu")
        except Exception as exc:  # SafetensorError, OSError
            raise CorruptCheckpointError(f"{who}{path} is not a readable safetensors file ({exc}); re-save or "
                                         "re-download it") from exc
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "global" not in str(exc).lower():
            raise CorruptCheckpointError(f"{who}{path} is not a readable torch file ({_first_line(exc)})") from exc
        if not allow_pickle:
            raise UnsafeCheckpointError(
                f"{who}{path} contains pickled Python objects that torch.load(weights_only=True) refuses "
                f"({_first_line(exc)}). Loading it could run arbitrary code: convert it to safetensors, or pass "
                "allow_pickle=True (CLI: --allow-pickle) only if you trust the file.") from exc
        warnings.warn(f"loading {path} with full pickle (allow_pickle=True): only do this for trusted files")
        obj = torch.load(str(path), map_location="cpu", weights_only=False)
    except Exception as exc:  # RuntimeError from the zip reader, EOFError, ...
        raise CorruptCheckpointError(f"{who}{path} is not a readable torch file ({_first_line(exc)})") from exc
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if isinstance(obj, nn.Module):
        obj = obj.state_dict()
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CorruptCheckpointError(f"{who}{path} does not hold a state dict of tensors (got {type(obj).__name__})")
    return obj


def _first_line(exc: BaseException) -> str:
    s = str(exc).strip()
    for line in s.splitlines():
        if "global" in line.lower() or "error" in line.lower():
            return line.strip()[:300]
    return s.splitlines()[0][:300] if s else type(exc).__name__


def tokenizer_folder(obj: "CheckpointRef | Trajectory | str | Path") -> Path | None:
    """Folder holding the tokenizer files for a checkpoint, trajectory or folder (None if none)."""

    def has_tok(p: Path) -> bool:
        return any((p / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model"))

    if isinstance(obj, CheckpointRef):
        try:
            folder = local_folder(obj)
        except CheckpointError:
            return None
        return folder if has_tok(folder) else (folder.parent if has_tok(folder.parent) else None)
    if isinstance(obj, Trajectory):
        tok = obj.meta.get("tokenizer_dir")
        if tok and has_tok(Path(tok)):
            return Path(tok)
        for ref in obj.checkpoints:
            found = tokenizer_folder(ref)
            if found is not None:
                return found
        return None
    p = Path(obj)
    if p.is_dir() and has_tok(p) and not (p / "trajectory.json").is_file():
        return p
    try:
        return tokenizer_folder(Trajectory.from_folder(p))
    except CheckpointError:
        return p if p.is_dir() and has_tok(p) else None


# --------------------------------------------------------------------------------------------
# trajectory
# --------------------------------------------------------------------------------------------

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
        """The :class:`~probes.tokenset.TokenSet` used for ``val_loss`` (train-tiny folders), or None."""
        path = self.meta.get("validation_set")
        if not path:
            return None
        from .tokenset import TokenSet

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
            raise NoCheckpointsError(f"{root} is not a folder; pass a folder of checkpoints (step-1000/, "
                                     "checkpoint-1000/, ...) or a checkpoint folder")
        root = root.resolve()
        refs: list[CheckpointRef] = []
        for child in sorted(root.iterdir()):
            if child.is_dir():
                if parse_step(child.name) is not None:
                    refs.append(CheckpointRef.from_path(child))
            elif child.suffix in _WEIGHT_SUFFIXES and child.name not in _TRAINER_FILES:
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
                "checkpoint-1000, iter_0001000, ...) each with config.json and weights, files like step1000.safetensors, "
                "or a trajectory.json")
        refs.sort(key=_sort_key)
        if tj_data is not None:
            refs = _apply_trajectory_json(refs, tj_data, root)
            meta.update({k: v for k, v in tj_data.items() if k != "checkpoints"})
            if tj_data.get("validation_set"):
                meta["validation_set"] = str(root / tj_data["validation_set"])
            if tj_data.get("tokenizer"):
                meta["tokenizer_dir"] = str(root / tj_data["tokenizer"])
            name = name or tj_data.get("name")
        states = _trainer_states(root, refs)
        if states:
            refs = _apply_trainer_state(refs, states)
            meta["trainer_state"] = True
        refs = [r if r.tokens is not None or "tokens_from_name" not in r.meta else r.replace(tokens=r.meta["tokens_from_name"])
                for r in refs]
        return cls(refs, name or root.name, meta)

    @classmethod
    def from_hub(cls, repo_id: str, revisions: "Sequence[str] | str", cache_dir: str | Path | None = None,
                 local_files_only: bool | None = None, available: Sequence[str] | None = None,
                 name: str | None = None) -> "Trajectory":
        """Checkpoints ``repo_id@revision`` for each revision.

        ``revisions``: a list of revision names (branches, tags or commit hashes), or one pattern --
        a glob (``"step*"``) or ``"re:<regex>"`` -- matched against ``available`` or, when that is
        not given, the repo's branches and tags (``huggingface_hub.list_repo_refs``; offline: the refs
        present in the local cache, ``<cache>/models--org--name/refs``).
        A pattern's matches are ordered by the step parsed from each name; a list keeps its order.
        ``local_files_only=None`` follows ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` at call
        time. No weights are downloaded here; files are resolved (downloaded when online and not
        cached) when a checkpoint is loaded.
        """
        if isinstance(revisions, str):
            pattern = revisions
            offline = _offline() if local_files_only is None else bool(local_files_only)
            if available is None and not offline:
                try:
                    from huggingface_hub import list_repo_refs

                    refs_ = list_repo_refs(repo_id)
                    available = sorted({b.name for b in refs_.branches} | {t.name for t in refs_.tags})
                except Exception:  # no network / private repo: fall back to the local cache
                    available = None
            if available is None:
                available = _cached_revisions(repo_id, cache_dir)
            if pattern.startswith("re:"):
                rx = re.compile(pattern[3:])
                revs = [r for r in available if rx.fullmatch(r)]
            else:
                revs = [r for r in available if fnmatch.fnmatchcase(r, pattern)]
            if not revs:
                raise NoCheckpointsError(
                    f"no revision of {repo_id} matches {pattern!r} among {len(available)} known revisions "
                    f"({', '.join(list(available)[:5])}{', ...' if len(available) > 5 else ''}); pass `available=` "
                    "(e.g. from huggingface_hub.list_repo_refs) or an explicit list of revisions")
        else:
            revs = list(revisions)
            if not revs:
                raise NoCheckpointsError(f"no revisions given for {repo_id}")
        refs = [CheckpointRef.from_hub(repo_id, r, cache_dir, local_files_only) for r in revs]
        refs = [r if "tokens_from_name" not in r.meta else r.replace(tokens=r.meta["tokens_from_name"]) for r in refs]
        if isinstance(revisions, str):
            refs.sort(key=_sort_key)
        return cls(refs, name or repo_id, {"repo_id": repo_id, "cache_dir": str(cache_dir) if cache_dir else None})

    @classmethod
    def from_list(cls, items: Iterable["CheckpointRef | str | Path"], name: str | None = None,
                  sort: bool = False, meta: dict | None = None) -> "Trajectory":
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
    def with_lawa(self, k: int = 3, label: str | None = None, at: int | str | None = None,
                  weights: Sequence[float] | None = None) -> "Trajectory":
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
            raise CheckpointError(f"LAWA over k={k} checkpoints needs 1 <= k <= {end} (checkpoints up to the end point)")
        ref = lawa(real[end - k:end], weights=weights, label=label)
        return Trajectory(self.checkpoints + [ref], self.name, self.meta)

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
                    problems.append(CheckpointProblem(ref.label, None, "config",
                                                      f"sources {missing} are not in this trajectory (still loadable)"))
                continue
            try:
                cfg = read_config(ref)
                mt = str(cfg.get("model_type"))
                if ref_type is None:
                    ref_type = (mt, ref.label)
                elif mt != ref_type[0]:
                    raise ArchitectureMismatchError(f"checkpoint {ref.label!r} is a {mt!r} model but {ref_type[1]!r} "
                                                    f"is a {ref_type[0]!r} model")
                if check_weights:
                    shapes = _file_shapes(_ref_weight_files(ref), ref.label)
                    if ref_shapes is None:
                        ref_shapes = (ref.label, shapes)
                    elif shapes != ref_shapes[1]:
                        diff = sorted(set(shapes.items()) ^ set(ref_shapes[1].items()))[:3]
                        raise ArchitectureMismatchError(f"checkpoint {ref.label!r} has different parameter names/shapes "
                                                        f"than {ref_shapes[0]!r} (e.g. {diff})")
            except CheckpointError as exc:
                kind = {MissingWeightsError: "missing", CorruptCheckpointError: "corrupt", UnsafeCheckpointError: "unsafe",
                        ArchitectureMismatchError: "architecture", RevisionNotCachedError: "hub"}.get(type(exc), "config")
                if raise_errors:
                    raise
                problems.append(CheckpointProblem(ref.label, ref.location, kind, str(exc)))
        return problems

    # serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"name": self.name, "meta": _jsonable(self.meta), "checkpoints": [c.to_dict() for c in self.checkpoints]}

    @classmethod
    def from_dict(cls, d: dict) -> "Trajectory":
        return cls([CheckpointRef.from_dict(c) for c in d["checkpoints"]], d.get("name"), d.get("meta"))


def _file_shapes(files: list[Path], label: str) -> dict[str, tuple]:
    """Parameter name -> shape from weight-file headers (safetensors: header only)."""
    out: dict[str, tuple] = {}
    for f in files:
        if f.suffix == ".safetensors":
            from safetensors import safe_open

            try:
                with safe_open(str(f), framework="pt") as h:
                    for k in h.keys():
                        out[k] = tuple(h.get_slice(k).get_shape())
            except Exception as exc:
                raise CorruptCheckpointError(f"checkpoint {label!r}: {f} is not a readable safetensors file ({exc})") from exc
        else:
            out.update({k: tuple(v.shape) for k, v in _load_weight_file(f, False, label).items()})
    return {k: v for k, v in out.items() if not _is_ignorable_buffer(k)}


def _cached_revisions(repo_id: str, cache_dir: str | Path | None) -> list[str]:
    folder = _hub_cache_dir(cache_dir) / ("models--" + repo_id.replace("/", "--")) / "refs"
    if not folder.is_dir():
        return []
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _apply_trajectory_json(refs: list[CheckpointRef], data: dict, root: Path) -> list[CheckpointRef]:
    by_path = {Path(e["path"]).name: e for e in data.get("checkpoints", []) if e.get("path")}
    by_step = {e["step"]: e for e in data.get("checkpoints", []) if e.get("step") is not None}
    out = []
    for r in refs:
        e = by_path.get(Path(r.location or "").name) or by_step.get(r.step)
        if e is None:
            out.append(r)
            continue
        extra = {k: v for k, v in e.items() if k not in ("path", "step", "tokens", "lr")}
        out.append(r.replace(step=e.get("step", r.step), tokens=e.get("tokens", r.tokens), lr=e.get("lr", r.lr),
                             meta={**r.meta, **extra, "source": "trajectory.json"}))
    return out


def _trainer_states(root: Path, refs: list[CheckpointRef]) -> list[dict]:
    files = [root / "trainer_state.json"] + [Path(r.location) / "trainer_state.json" for r in refs
                                              if r.kind == "hf_dir" and r.location]
    states = []
    for f in files:
        if f.is_file():
            try:
                states.append(json.loads(f.read_text()))
            except ValueError:
                warnings.warn(f"ignoring unreadable {f}")
    return states


def _apply_trainer_state(refs: list[CheckpointRef], states: list[dict]) -> list[CheckpointRef]:
    """LR / tokens / losses from HF Trainer ``log_history``: the entry logged at the checkpoint's
    step, else the latest entry logged before it (Trainer logs every ``logging_steps``)."""
    seen, log = set(), []
    for st in states:
        for e in st.get("log_history", []):
            key = json.dumps(e, sort_keys=True)
            if "step" in e and key not in seen:
                seen.add(key)
                log.append(e)
    log.sort(key=lambda e: e["step"])

    def lookup(field_: str, step: int, exact: bool = False) -> tuple[Any, int] | None:
        best = None
        for e in log:
            if field_ in e and e["step"] <= step:
                best = (e[field_], e["step"])
        if best is not None and exact and best[1] != step:
            return None
        return best

    out = []
    for r in refs:
        if r.step is None:
            out.append(r)
            continue
        meta = dict(r.meta)
        lr, tokens = r.lr, r.tokens
        hit = lookup("learning_rate", r.step)
        if lr is None and hit is not None:
            lr = float(hit[0])
            meta["lr_logged_at"] = hit[1]
        hit = lookup("num_input_tokens_seen", r.step)
        if tokens is None and hit is not None:
            tokens = int(hit[0])
            meta["tokens_logged_at"] = hit[1]
        for src, dst in (("loss", "train_loss"), ("eval_loss", "val_loss")):
            hit = lookup(src, r.step, exact=True)
            if hit is not None and dst not in meta:
                meta[dst] = float(hit[0])
        out.append(r.replace(lr=lr, tokens=tokens, meta=meta))
    return out


# --------------------------------------------------------------------------------------------
# derived checkpoints
# --------------------------------------------------------------------------------------------

def lawa(refs: Sequence[CheckpointRef], weights: Sequence[float] | None = None, label: str | None = None) -> CheckpointRef:
    """A derived checkpoint: the weighted mean of ``refs``' weights (uniform by default; weights are
    normalised to sum 1), computed when loaded. Its step / tokens / LR are the last source's.
    Configs are checked now (same ``model_type`` and dimensions when readable); parameter names
    and shapes when loaded. Raises :class:`ArchitectureMismatchError` naming the odd checkpoint.
    """
    refs = list(refs)
    if not refs:
        raise CheckpointError("lawa() needs at least one checkpoint")
    if weights is None:
        w = [1.0 / len(refs)] * len(refs)
    else:
        if len(weights) != len(refs):
            raise CheckpointError(f"lawa(): {len(weights)} weights for {len(refs)} checkpoints")
        total = float(sum(weights))
        if total == 0 or any(x < 0 for x in weights):
            raise CheckpointError("lawa(): weights must be non-negative and not all zero")
        w = [float(x) / total for x in weights]
    _check_configs(refs)
    last = refs[-1]
    label = label or f"lawa{len(refs)}@{last.label}"
    return CheckpointRef(label, last.step, last.tokens, last.lr, None, "derived", None,
                         tuple(r.label for r in refs), tuple(w),
                         meta={"method": "lawa" if weights is None else "soup", "sources": tuple(refs)})


_ARCH_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
              "n_embd", "n_layer", "n_head", "d_model")


def _check_configs(refs: Sequence[CheckpointRef]) -> None:
    first = None
    for r in refs:
        if r.derived or r.kind == "hub":
            continue  # hub: avoid resolving files at construction time; checked when loaded
        try:
            cfg = read_config(r)
        except CheckpointError:
            continue  # reported when loaded
        arch = {k: cfg.get(k) for k in _ARCH_KEYS if k in cfg}
        if first is None:
            first = (r.label, arch)
        elif arch != first[1]:
            diff = {k: (first[1].get(k), arch.get(k)) for k in set(arch) | set(first[1]) if first[1].get(k) != arch.get(k)}
            raise ArchitectureMismatchError(f"cannot average checkpoint {r.label!r} with {first[0]!r}: their configs "
                                            f"differ in {diff}")


# --------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------

_IGNORABLE_BUFFER_SUFFIXES = (".attention.bias", ".attention.masked_bias", ".attn.bias", ".attn.masked_bias",
                              ".rotary_emb.inv_freq", ".masked_bias")


def _is_ignorable_buffer(name: str) -> bool:
    return name.endswith(_IGNORABLE_BUFFER_SUFFIXES)


class CheckpointLoader:
    """Loads checkpoints of one trajectory into **one** reused model instance.

    ``loader.load(ref)`` returns the same ``nn.Module`` every time, with ``ref``'s weights copied
    in (``ref``: a :class:`CheckpointRef`, a label or an index into the trajectory). The model is
    built on the first call from that checkpoint's ``config.json``
    (``AutoModelForCausalLM.from_config``), cast to ``dtype`` / moved to ``device`` (defaults: float32,
    CPU; stored weights of another dtype are converted on copy), and put in eval mode. Later checkpoints must have
    the same ``model_type`` and parameter names/shapes, or :class:`ArchitectureMismatchError` names the
    checkpoint. Anything that modifies the returned model in place (quantization with
    ``inplace=True``) is undone by the next ``load``. Cost: one weight-file read + copy per call;
    derived checkpoints read each source once.
    """

    def __init__(self, trajectory_or_ref: "Trajectory | CheckpointRef | str | Path", dtype: torch.dtype | None = None,
                 device: str | torch.device | None = None, allow_pickle: bool = False,
                 attn_implementation: str | None = None):
        if isinstance(trajectory_or_ref, Trajectory):
            self.trajectory = trajectory_or_ref
        elif isinstance(trajectory_or_ref, CheckpointRef):
            self.trajectory = Trajectory([trajectory_or_ref], trajectory_or_ref.label)
        else:
            self.trajectory = Trajectory.from_folder(trajectory_or_ref)
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else None
        self.allow_pickle = allow_pickle
        self.attn_implementation = attn_implementation
        self._model: nn.Module | None = None
        self._template: tuple[str, str] | None = None  # (label, model_type)
        self.current: CheckpointRef | None = None

    @property
    def model(self) -> nn.Module | None:
        """The reused model instance (None before the first :meth:`load`)."""
        return self._model

    def _ref(self, ref: "CheckpointRef | str | int") -> CheckpointRef:
        return ref if isinstance(ref, CheckpointRef) else self.trajectory[ref]

    def _build(self, ref: CheckpointRef) -> nn.Module:
        from transformers import AutoConfig, AutoModelForCausalLM

        folder = local_folder(ref)
        read_config(ref)  # specific error if missing
        try:
            config = AutoConfig.from_pretrained(str(folder))
        except Exception as exc:
            raise CorruptCheckpointError(f"checkpoint {ref.label!r}: transformers cannot read {folder / 'config.json'}: {exc}") from exc
        kwargs = {"attn_implementation": self.attn_implementation} if self.attn_implementation else {}
        model = AutoModelForCausalLM.from_config(config, **kwargs)
        model.to(device=self.device or torch.device("cpu"), dtype=self.dtype or torch.float32)
        model.eval()
        model.requires_grad_(True)
        self._template = (ref.label, str(getattr(config, "model_type", None)))
        return model

    def load(self, ref: "CheckpointRef | str | int") -> nn.Module:
        """The reused model holding ``ref``'s weights (eval mode)."""
        ref = self._ref(ref)
        base = ref
        while base.derived:
            if not base.sources:
                raise CheckpointError(f"derived checkpoint {ref.label!r} has no sources")
            base = base.sources[0]
        if self._model is None:
            self._model = self._build(base)
        else:
            for r in ([ref] if not ref.derived else list(_leaves(ref))):
                mt = str(read_config(r).get("model_type"))
                if mt != self._template[1]:
                    raise ArchitectureMismatchError(
                        f"checkpoint {r.label!r} is a {mt!r} model but this loader holds a {self._template[1]!r} model built "
                        f"from {self._template[0]!r}; a trajectory must have one architecture")
        state = self.state_dict(ref)
        self._copy_in(state, ref)
        self._model.eval()
        self.current = ref
        return self._model

    def _copy_in(self, state: dict[str, torch.Tensor], ref: CheckpointRef) -> None:
        model = self._model
        target = model.state_dict(keep_vars=True)
        state = _rename_legacy_keys(state, model, target)
        ptr_names: dict[int, list[str]] = {}
        for n, t in target.items():
            ptr_names.setdefault(id(t), []).append(n)
        params = {n for n, _ in model.named_parameters(remove_duplicate=False)}
        missing = []
        for n, t in target.items():
            if n in state:
                continue
            if any(a in state for a in ptr_names[id(t)]):  # tied weights: present under another name
                continue
            if n in params:
                missing.append(n)
        unexpected = [k for k in state if k not in target and not _is_ignorable_buffer(k)]
        who = f"checkpoint {ref.label!r}" + (f" ({ref.location})" if ref.location else "")
        tmpl = self._template[0] if self._template else "?"
        if missing or unexpected:
            raise ArchitectureMismatchError(
                f"{who} does not match the {type(model).__name__} built from {tmpl!r}: missing parameters "
                f"{missing[:5]}{'...' if len(missing) > 5 else ''}, unexpected keys {unexpected[:5]}"
                f"{'...' if len(unexpected) > 5 else ''}")
        for n, t in target.items():
            if n in state and tuple(state[n].shape) != tuple(t.shape):
                raise ArchitectureMismatchError(f"{who}: parameter {n} has shape {tuple(state[n].shape)} but "
                                                f"{tuple(t.shape)} in the model built from {tmpl!r}")
        with torch.no_grad():
            for n, t in target.items():
                if n in state:
                    t.copy_(state[n])

    def state_dict(self, ref: "CheckpointRef | str | int") -> dict[str, torch.Tensor]:
        """``ref``'s weights as a dict of CPU tensors in their stored dtype (derived: the weighted
        mean, accumulated in float64 and cast back to the first source's dtypes)."""
        ref = self._ref(ref)
        if ref.derived:
            return _average(ref, self)
        state: dict[str, torch.Tensor] = {}
        for f in _ref_weight_files(ref):
            state.update(_load_weight_file(f, self.allow_pickle, ref.label))
        return state

    def tokenizer(self):
        """The trajectory's tokenizer (``AutoTokenizer`` from the checkpoint folder), or None."""
        folder = tokenizer_folder(self.trajectory)
        if folder is None:
            return None
        from .data import load_tokenizer

        return load_tokenizer(folder)


def _leaves(ref: CheckpointRef) -> Iterator[CheckpointRef]:
    if ref.derived:
        for s in ref.sources:
            yield from _leaves(s)
    else:
        yield ref


def _average(ref: CheckpointRef, loader: CheckpointLoader) -> dict[str, torch.Tensor]:
    """Weighted mean of the sources' state dicts, reading one source at a time (memory: 2 copies)."""
    sources = ref.sources
    if not sources:
        raise CheckpointError(f"derived checkpoint {ref.label!r} has no sources")
    weights = ref.weights or tuple([1.0 / len(sources)] * len(sources))
    acc: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    first_label = sources[0].label
    for i, (src, w) in enumerate(zip(sources, weights)):
        sd = loader.state_dict(src)
        if i == 0:
            for k, v in sd.items():
                dtypes[k] = v.dtype
                acc[k] = v.to(torch.float64) * w if v.is_floating_point() else v.clone()
            continue
        if set(sd) != set(acc):
            diff = sorted(set(sd) ^ set(acc))[:5]
            raise ArchitectureMismatchError(f"cannot average checkpoint {src.label!r} with {first_label!r} in "
                                            f"{ref.label!r}: parameter names differ ({diff})")
        for k, v in sd.items():
            if tuple(v.shape) != tuple(acc[k].shape):
                raise ArchitectureMismatchError(f"cannot average checkpoint {src.label!r} with {first_label!r} in "
                                                f"{ref.label!r}: {k} has shape {tuple(v.shape)} vs {tuple(acc[k].shape)}")
            if v.is_floating_point():
                acc[k] += v.to(torch.float64) * w
    return {k: v.to(dtypes[k]) for k, v in acc.items()}


def load_model(ref: "CheckpointRef | str | Path", dtype: torch.dtype | None = None, device: str | torch.device | None = None,
               allow_pickle: bool = False, attn_implementation: str | None = None) -> nn.Module:
    """A fresh model holding ``ref``'s weights (a ref or a checkpoint folder / weight file path).
    Same safety and checks as :class:`CheckpointLoader`; builds a new model each call."""
    if not isinstance(ref, CheckpointRef):
        ref = CheckpointRef.from_path(ref)
    return CheckpointLoader(ref, dtype, device, allow_pickle, attn_implementation).load(ref)


def _rename_legacy_keys(state: dict[str, torch.Tensor], model: nn.Module, target: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Map checkpoint keys the model does not know to its own names with transformers' renamings.

    transformers 5 renames some weights at load time and back at save time (GPT-NeoX stores its head
    as ``embed_out.weight`` — also in every real Pythia checkpoint — while the module is
    ``lm_head``). Only pure one-to-one renamings are applied; keys already known are kept as they are.
    """
    unknown = [k for k in state if k not in target]
    if not unknown:
        return state
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming

        renamings = [t for t in get_model_conversion_mapping(model) if type(t) is WeightRenaming]
    except Exception:  # older/newer transformers without this API: nothing to rename
        return state
    out = dict(state)
    for key in unknown:
        for rule in renamings:
            new, matched = rule.rename_source_key(key)
            if matched is not None and new in target and new not in out:
                out[new] = out.pop(key)
                break
    return out
