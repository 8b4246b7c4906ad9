"""Exceptions of :mod:`losslens.lm.checkpoints`: all derive from :class:`CheckpointError`."""

from __future__ import annotations

from losslens.geometry.base.errors import LosslensError

__all__ = [
    "CheckpointError",
    "NoCheckpointsError",
    "MissingWeightsError",
    "CorruptCheckpointError",
    "UnsafeCheckpointError",
    "ArchitectureMismatchError",
    "RevisionNotCachedError",
    "TrajectoryNameError",
    "ScheduleError",
]


class CheckpointError(LosslensError, RuntimeError):
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


class TrajectoryNameError(CheckpointError):
    """A trajectory / checkpoint name (``hf:org/name@revisions``) that cannot be parsed."""


class ScheduleError(CheckpointError):
    """A learning-rate schedule spec, a tokens-per-step value or a ``trajectory.json`` schedule
    that is malformed or does not fit the trajectory's checkpoints."""
