"""Hugging Face hub checkpoints: resolving ``repo@revision`` through the local HF cache.

Files are resolved with ``huggingface_hub.snapshot_download(repo_id, revision=...)`` -- the same
cached files ``from_pretrained(repo_id, revision=...)`` uses -- and work offline
(``HF_HUB_OFFLINE=1`` or ``local_files_only=True``) from the local cache.
"""
from __future__ import annotations

import os
from pathlib import Path

from .errors import CheckpointError, RevisionNotCachedError
from .refs import CheckpointRef


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
        folder = snapshot_download(ref.location, revision=ref.revision, cache_dir=cache_dir, local_files_only=offline,
                                   allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"])
        if not offline and not any(Path(folder).glob("*.safetensors")):
            folder = snapshot_download(ref.location, revision=ref.revision, cache_dir=cache_dir,
                                       allow_patterns=["*.json", "pytorch_model*.bin"])
    except LocalEntryNotFoundError as exc:
        where = hub_cache_dir(cache_dir)
        cmd = download_command(ref.location, ref.revision, cache_dir)
        if offline:
            raise RevisionNotCachedError(
                f"{ref.location}@{ref.revision} is not in the local Hugging Face cache and offline mode is on "
                f"(HF_HUB_OFFLINE=1): download it with `{cmd}`, or unset HF_HUB_OFFLINE to let losslens download it "
                f"(huggingface_hub < 0.34: `huggingface-cli download`, same arguments); cache: {where}") from exc
        raise RevisionNotCachedError(
            f"checkpoint {ref.label!r}: revision {ref.revision!r} of {ref.location} could not be downloaded and is not "
            f"in the local cache ({where}): {exc}; when the hub is reachable, `{cmd}` fetches it") from exc
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
