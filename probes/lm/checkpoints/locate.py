"""One place that turns a command-line trajectory or checkpoint argument into a trajectory.

Every command opens its argument here: :func:`open_trajectory` (``losslens sweep``) and
:func:`open_checkpoint` (``sharpness``, ``quantize``, ``surface``, ``explain``). An argument is

- a **folder**: a trajectory folder (:meth:`Trajectory.from_folder`), a single checkpoint folder
  or a weight file; a llama.cpp ``.gguf`` file is dequantized once into a checkpoint folder
  (:mod:`losslens.lm.checkpoints.gguf`), and a hub revision whose snapshot is one ``.gguf`` file likewise. A single
  checkpoint that sits in a trajectory folder is returned as that
  trajectory's reference, so its step, tokens and LR (``trajectory.json``, ``trainer_state.json``)
  and the trajectory's tokenizer come with it;
- a **hub name** ``hf:ORG/NAME[@REVISIONS]`` (:func:`parse_hub_name`), resolved through the local
  Hugging Face cache (:meth:`Trajectory.from_hub`; offline when ``HF_HUB_OFFLINE=1``).
  ``REVISIONS`` is a comma-separated list of revision names (``@step1000,step2000``, kept in that
  order), globs (``@step*``, ``@stage1-step*``) or one ``re:REGEX`` (``@re:step\\d+000``; the rest of
  the name is the regex); with a pattern the checkpoints are ordered by step. Without ``@`` the
  revision is ``main``.

A schedule (``schedule=``, ``tokens_per_step=``: :mod:`losslens.lm.checkpoints.schedule`) derives LR
and tokens from each checkpoint's step and replaces recorded values; ``trajectory.json`` files
passed as ``sidecars`` (and the one inside a trajectory folder) only fill values that are missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from losslens.lm.checkpoints.errors import CheckpointError, NoCheckpointsError, TrajectoryNameError
from losslens.lm.checkpoints.gguf import dequantized
from losslens.lm.checkpoints.refs import CheckpointRef
from losslens.lm.checkpoints.schedule import Schedule, read_sidecar
from losslens.lm.checkpoints.trajectory import Trajectory

__all__ = [
    "open_checkpoint",
    "open_trajectory",
    "parse_hub_name",
    "HubName",
    "HUB_PREFIX",
    "NAME_HELP",
]

HUB_PREFIX = "hf:"
NAME_HELP = (
    "a folder, or a hub trajectory hf:ORG/NAME@REVISIONS with REVISIONS a glob (step*), re:REGEX or a "
    "list (step1000,step2000); hf:ORG/NAME alone is the main revision"
)
_REPO = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class HubName:
    """A parsed ``hf:ORG/NAME@REVISIONS``: the repo id and the revision items (names, globs, ``re:``)."""

    repo_id: str
    revisions: tuple[str, ...]

    def __str__(self) -> str:
        return f"{HUB_PREFIX}{self.name}"

    @property
    def name(self) -> str:
        """``ORG/NAME@REVISIONS``: the name of its trajectory."""
        return f"{self.repo_id}@{','.join(self.revisions)}"


def parse_hub_name(name: "str | Path") -> HubName | None:
    """The :class:`HubName` of ``hf:ORG/NAME[@REVISIONS]`` (see the module docstring), or None when
    ``name`` does not start with ``hf:``. Raises :class:`TrajectoryNameError` for a malformed name."""
    text = str(name).strip()
    if not text.startswith(HUB_PREFIX):
        return None
    repo, at, sel = text[len(HUB_PREFIX) :].partition("@")
    if not _REPO.match(repo) or ".." in repo:
        raise TrajectoryNameError(
            f"{text!r}: {repo!r} is not a hub repo id (ORG/NAME, e.g. EleutherAI/pythia-160m); "
            f"a trajectory is {NAME_HELP}"
        )
    if not at:
        return HubName(repo, ("main",))
    if sel.startswith("re:"):
        try:
            re.compile(sel[3:])
        except re.error as exc:
            raise TrajectoryNameError(f"{text!r}: {sel!r} is not a valid regular expression: {exc}") from None
        return HubName(repo, (sel,))
    items = tuple(x.strip() for x in sel.split(","))
    if not all(items):
        raise TrajectoryNameError(f"{text!r}: empty revision after '@' or between commas; {NAME_HELP}")
    return HubName(repo, items)


def open_trajectory(
    name: "str | Path | Trajectory",
    cache_dir: str | Path | None = None,
    schedule: "Schedule | str | None" = None,
    tokens_per_step: int | None = None,
    sidecars: Sequence[str | Path] = (),
) -> Trajectory:
    """The :class:`Trajectory` named by ``name``: a folder, ``hf:ORG/NAME@REVISIONS``, or a Trajectory.

    ``cache_dir``: the Hugging Face hub cache for hub names (default ``$HF_HUB_CACHE`` / ``$HF_HOME/hub``
    / ``~/.cache/huggingface/hub``). ``schedule`` / ``tokens_per_step`` derive LR and tokens for every
    checkpoint (replacing recorded values); each existing file in ``sidecars`` (a ``trajectory.json``
    with ``"schedule"`` / ``"tokens_per_step"``) fills only what is still missing. Reads names and
    small JSON files only, never weights. Raises :class:`NoCheckpointsError` (nothing there),
    :class:`TrajectoryNameError`, :class:`~losslens.lm.checkpoints.errors.ScheduleError`.
    """
    if isinstance(name, Trajectory):
        traj = name
    else:
        hub = parse_hub_name(name)
        if hub is not None:
            traj = Trajectory.from_hub(hub.repo_id, list(hub.revisions), cache_dir=cache_dir, name=hub.name)
        else:
            p = _local_path(name, "trajectory", "the folder does not exist; a trajectory is")
            traj = Trajectory.from_folder(p) if p.is_dir() else Trajectory.from_list([p], p.stem)
    for sidecar in sidecars:
        sched, tps = read_sidecar(sidecar)
        if sched is not None or tps is not None:
            traj = traj.with_schedule(sched, tps, override=False)
    if schedule is not None or tokens_per_step is not None:
        traj = traj.with_schedule(schedule, tokens_per_step, override=True)
    return traj


def _local_path(name: "str | Path", what: str, missing: str) -> Path:
    """``name`` as a local path (a ``.gguf`` file: its dequantized checkpoint folder); raises
    :class:`NoCheckpointsError` (``no WHAT at PATH: MISSING ...``) when nothing is there."""
    p = dequantized(Path(name).expanduser())
    if not p.exists():
        raise NoCheckpointsError(f"no {what} at {p}: {missing} {NAME_HELP}")
    return p


def open_checkpoint(
    path: "str | Path",
    label: str | None = None,
    cache_dir: str | Path | None = None,
    schedule: "Schedule | str | None" = None,
    tokens_per_step: int | None = None,
    alone: bool = False,
) -> tuple[Trajectory, CheckpointRef]:
    """``(trajectory, checkpoint)`` for a checkpoint argument given on the command line, in one pass.

    ``path``: a trajectory folder or a hub trajectory ``hf:ORG/NAME@REVISIONS`` (``label`` picks a
    checkpoint, default the last real one), a checkpoint folder or weight file (the trajectory folder
    around it, when it sits in one, is listed instead, so its step / tokens / LR and tokenizer come
    with it), or a single hub revision ``hf:ORG/NAME@REV`` (``label``, when given, must name it).
    ``cache_dir``, ``schedule``, ``tokens_per_step``: as :func:`open_trajectory`. ``alone``: the
    trajectory returned holds only that checkpoint (:meth:`Trajectory.only`), what a single-checkpoint
    command loads from. Raises :class:`NoCheckpointsError` when nothing is there and
    :class:`CheckpointError` for an unknown label (the message lists the labels). Reads names and
    small JSON files only, never weights (a hub revision with ``alone``: its snapshot is resolved).
    """
    hub = parse_hub_name(path)
    if hub is None:
        p = _local_path(
            path, "checkpoint", "the path does not exist; a checkpoint is a checkpoint folder, a weight file, or"
        )
        where, here = str(p), p.resolve()
        traj: Trajectory = Trajectory.from_folder(p) if p.is_dir() else Trajectory.from_list([p], p.stem)
        single = p.is_file() or (len(traj) == 1 and _at(traj[0], here))
        if single and label in (None, traj[0].label):
            try:  # the trajectory folder around it knows its step / tokens / LR and tokenizer
                parent = Trajectory.from_folder(p.parent)
            except CheckpointError:
                parent = None
            hit = next((r for r in parent if _at(r, here)), None) if parent is not None else None
            if hit is not None:
                traj, label = parent, hit.label
    else:
        where = str(path)
        traj = Trajectory.from_hub(hub.repo_id, list(hub.revisions), cache_dir=cache_dir, name=hub.name)
    if schedule is not None or tokens_per_step is not None:
        traj = traj.with_schedule(schedule, tokens_per_step, override=True)
    if label is None:
        real = traj.real
        ref = real[-1] if real else traj[-1]
    else:
        try:
            ref = traj[label]
        except KeyError as exc:
            raise CheckpointError(
                f"{where} has no checkpoint {label!r}; labels: {', '.join(traj.labels[:12])}"
                f"{' ...' if len(traj) > 12 else ''}"
            ) from exc
    return (traj.only(ref) if alone else traj), ref


def _at(ref: CheckpointRef, here: Path) -> bool:
    """Whether ``ref`` is the checkpoint at the resolved path ``here``."""
    return ref.location is not None and Path(ref.location).resolve() == here
