"""A Hugging Face hub cache laid out by hand, as ``huggingface_hub`` writes it (tests run offline).

``<cache>/models--org--name/refs/<revision>`` holds a commit hash, ``snapshots/<commit>/<file>`` are
relative symlinks into ``blobs/<sha256>``. :func:`add_revision` copies a saved checkpoint folder
(config, weights, tokenizer) in as one revision; :func:`add_ref_only` writes a ref whose snapshot
was never downloaded (what an interrupted download leaves behind).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path


def repo_folder(cache: Path, repo_id: str) -> Path:
    return Path(cache) / ("models--" + repo_id.replace("/", "--"))


def _commit(revision: str) -> str:
    return hashlib.sha1(revision.encode()).hexdigest()


def add_revision(cache: Path, repo_id: str, revision: str, folder: Path) -> Path:
    """Copy every file of ``folder`` into the cache as ``repo_id@revision``; return the snapshot folder."""
    repo = repo_folder(cache, repo_id)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "blobs").mkdir(exist_ok=True)
    commit = _commit(revision)
    (repo / "refs" / revision).write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    for f in sorted(Path(folder).iterdir()):
        if f.is_file():
            blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
            if not blob.exists():
                shutil.copy(f, blob)
            (snap / f.name).symlink_to(Path("../../blobs") / blob.name)
    return snap


def add_ref_only(cache: Path, repo_id: str, revision: str) -> None:
    """A ref for ``revision`` whose snapshot folder does not exist."""
    repo = repo_folder(cache, repo_id)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / revision).write_text(_commit(revision))
