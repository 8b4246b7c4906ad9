"""Hugging Face hub checkpoints: resolving ``repo@revision`` through the local HF cache.

Files are resolved with ``huggingface_hub.snapshot_download(repo_id, revision=...)`` -- the same
cached files ``from_pretrained(repo_id, revision=...)`` uses -- and work offline
(``HF_HUB_OFFLINE=1`` or ``local_files_only=True``) from the local cache.
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path
from typing import Sequence

from losslens.lm.checkpoints.errors import CheckpointError, NoCheckpointsError, RevisionNotCachedError
from losslens.lm.checkpoints.refs import CheckpointRef


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` ask for offline mode."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in ("1", "ON", "YES", "TRUE"):
            return True
    return False


def hub_cache_dir(cache_dir: str | Path | None) -> Path:
    """The HF hub cache folder: ``cache_dir``, ``$HF_HUB_CACHE``, ``$HF_HOME/hub`` or huggingface_hub's default."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def hub_folder(ref: CheckpointRef) -> Path:
    """The local snapshot folder of a hub ref (downloaded when online and not cached)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    lfo = ref.meta.get("local_files_only")
    offline = hub_offline() if lfo is None else bool(lfo)
    cache_dir = ref.meta.get("cache_dir")
    try:
        # like from_pretrained: safetensors when the revision has them, pytorch_model*.bin otherwise
        folder = snapshot_download(
            ref.location,
            revision=ref.revision,
            cache_dir=cache_dir,
            local_files_only=offline,
            allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"],
        )
        if not offline and not any(Path(folder).glob("*.safetensors")):
            folder = snapshot_download(
                ref.location,
                revision=ref.revision,
                cache_dir=cache_dir,
                allow_patterns=["*.json", "pytorch_model*.bin"],
            )
    except LocalEntryNotFoundError as exc:
        where = hub_cache_dir(cache_dir)
        cmd = download_command(ref.location, ref.revision, cache_dir)
        if offline:
            raise RevisionNotCachedError(
                f"{ref.location}@{ref.revision} is not in the local Hugging Face cache and offline mode is on "
                f"(HF_HUB_OFFLINE=1): download it with `{cmd}`, or unset HF_HUB_OFFLINE to let losslens download it "
                f"(huggingface_hub < 0.34: `huggingface-cli download`, same arguments); cache: {where}"
            ) from exc
        raise RevisionNotCachedError(
            f"checkpoint {ref.label!r}: revision {ref.revision!r} of {ref.location} could not be downloaded and is not "
            f"in the local cache ({where}): {exc}; when the hub is reachable, `{cmd}` fetches it"
        ) from exc
    except Exception as exc:  # RepositoryNotFound, RevisionNotFound, network errors
        raise CheckpointError(f"checkpoint {ref.label!r}: cannot resolve {ref.location}@{ref.revision}: {exc}") from exc
    return Path(folder)


def download_command(repo_id: str, revision: str | None, cache_dir: str | Path | None = None) -> str:
    """The ``hf download`` command that puts ``repo_id@revision`` into the cache losslens reads."""
    cmd = f"hf download {repo_id}" + (f" --revision {revision}" if revision else "")
    return cmd + (f" --cache-dir {Path(cache_dir).expanduser()}" if cache_dir else "")


def cached_revisions(repo_id: str, cache_dir: str | Path | None) -> list[str]:
    """The revision names with a ref in the local cache (``<cache>/models--org--name/refs``), sorted;
    a ref may lack its snapshot (a ``main`` ref written by a partial download)."""
    folder = hub_cache_dir(cache_dir) / ("models--" + repo_id.replace("/", "--")) / "refs"
    if not folder.is_dir():
        return []
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def is_pattern(item: str) -> bool:
    """A revision item that is a pattern: ``re:...`` or a glob (git ref names cannot hold ``*?[`` or ``:``)."""
    return item.startswith("re:") or any(c in item for c in "*?[")


def match_revisions(pattern: str, available: Sequence[str]) -> list[str]:
    """The names in ``available`` that ``pattern`` (``re:REGEX``, full match, or a glob) matches, in their order."""
    if pattern.startswith("re:"):
        try:
            rx = re.compile(pattern[3:])
        except re.error as exc:
            raise NoCheckpointsError(f"revision pattern {pattern!r} is not a valid regular expression: {exc}") from exc
        return [r for r in available if rx.fullmatch(r)]
    return [r for r in available if fnmatch.fnmatchcase(r, pattern)]


def hub_revisions(
    repo_id: str,
    items: Sequence[str],
    cache_dir: str | Path | None = None,
    local_files_only: bool | None = None,
    available: Sequence[str] | None = None,
) -> tuple[list[str], list[str]]:
    """The revision names ``items`` of ``repo_id`` stand for, in order, and the items that were patterns.

    An item is a revision name (taken as given), a glob (``"step*"``) or ``"re:<regex>"`` (full
    match); patterns are matched against ``available`` or, when that is not given, the repo's
    branches and tags (``huggingface_hub.list_repo_refs``; offline, or when the hub cannot be
    reached: the refs in the local cache). Raises :class:`NoCheckpointsError` when a pattern
    matches no revision."""
    patterns = [x for x in items if is_pattern(x)]
    revs = list(dict.fromkeys(x for x in items if not is_pattern(x)))
    if patterns:
        offline = hub_offline() if local_files_only is None else bool(local_files_only)
        if available is None and not offline:
            try:
                from huggingface_hub import list_repo_refs

                refs_ = list_repo_refs(repo_id)
                available = sorted({b.name for b in refs_.branches} | {t.name for t in refs_.tags})
            except Exception:  # no network / private repo: fall back to the local cache
                available = None
        where = "" if available is not None else f" in the local Hugging Face cache ({hub_cache_dir(cache_dir)})"
        if available is None:
            available = cached_revisions(repo_id, cache_dir)
        for pattern in patterns:
            hits = match_revisions(pattern, available)
            if not hits:
                raise NoCheckpointsError(
                    f"no revision of {repo_id} matches {pattern!r} among {len(available)} known revisions{where} "
                    f"({', '.join(list(available)[:5])}{', ...' if len(available) > 5 else ''}); download them "
                    f"first (`{download_command(repo_id, 'REV', cache_dir)}`), or name revisions explicitly "
                    "(hf:org/name@step1000,step2000 / a list)"
                )
            revs.extend(h for h in hits if h not in revs)
    return revs, patterns
