"""One place that turns a command-line checkpoint argument into a trajectory and a checkpoint.

:func:`open_checkpoint` accepts a trajectory folder (picks a label, default the last real
checkpoint), a single checkpoint folder or a single weight file. A single checkpoint that sits in
a trajectory folder is returned as that trajectory's reference, so its step, tokens and LR (from
``trajectory.json`` or HF Trainer's ``trainer_state.json``) and the trajectory's tokenizer come
with it. The commands (``losslens sharpness`` …) open their checkpoint argument through it.
"""
from __future__ import annotations

from pathlib import Path

from .errors import CheckpointError, NoCheckpointsError
from .refs import CheckpointRef
from .trajectory import Trajectory

__all__ = ["open_checkpoint"]


def _same(location: str | None, path: Path) -> bool:
    return location is not None and Path(location).resolve() == path.resolve()


def open_checkpoint(path: str | Path, label: str | None = None) -> tuple[Trajectory, CheckpointRef]:
    """``(trajectory, checkpoint)`` for a path given on the command line.

    ``path``: a trajectory folder (``label`` picks a checkpoint, default the last real one), a
    checkpoint folder or a weight file (``label``, when given, must name it). Raises
    :class:`NoCheckpointsError` when nothing is there and :class:`CheckpointError` for an unknown
    label (the message lists the labels). Reads names and small JSON files only, never weights.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise NoCheckpointsError(f"no checkpoint at {p}: the path does not exist")
    traj = Trajectory.from_folder(p) if p.is_dir() else Trajectory([CheckpointRef.from_path(p)], p.stem)
    single = p.is_file() or (len(traj) == 1 and _same(traj[0].location, p))
    if single and label in (None, traj[0].label):
        try:  # the trajectory folder around it knows its step / tokens / LR and tokenizer
            parent = Trajectory.from_folder(p.parent)
        except CheckpointError:
            parent = None
        hit = next((r for r in parent if _same(r.location, p)), None) if parent is not None else None
        if hit is not None:
            return parent, hit
    if label is not None:
        try:
            return traj, traj[label]
        except KeyError as exc:
            raise CheckpointError(f"{p} has no checkpoint {label!r}; labels: {', '.join(traj.labels[:12])}"
                                  f"{' ...' if len(traj) > 12 else ''}") from exc
    real = traj.real
    return traj, (real[-1] if real else traj[-1])
