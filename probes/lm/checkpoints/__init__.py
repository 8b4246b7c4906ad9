"""Checkpoints, trajectories, safe loading and derived (LAWA / soup) checkpoints (docs/science.md §6).

    from losslens.lm.checkpoints import Trajectory, CheckpointLoader
    traj = Trajectory.from_folder("runs/wsd").with_lawa(k=3)
    model = CheckpointLoader(traj).load(traj[-1])      # one model instance, weights copied in

Modules (each imports only the ones above it):

- :mod:`.errors`     -- :class:`CheckpointError` and its subclasses;
- :mod:`.refs`       -- :class:`CheckpointRef` (where one checkpoint is; no weights), :func:`parse_step`;
- :mod:`.schedule`   -- :class:`Schedule`: LR and tokens per checkpoint from a published schedule (spec
  strings, presets such as ``pythia-160m``, ``trajectory.json`` sidecars);
- :mod:`.hub`        -- hub ``repo@revision`` resolved through the local HF cache (offline-capable), revision
  patterns (globs, ``re:``) matched against the repo's refs;
- :mod:`.files`      -- config / weight files, safe weight reading (safetensors; torch files only
  with ``weights_only=True``; pickles refused unless ``allow_pickle=True``);
- :mod:`.derived`    -- :func:`lawa`: LAWA / soup checkpoints, averaged when loaded;
- :mod:`.records`    -- what a trajectory folder records per checkpoint (``trajectory.json``, HF Trainer's
  ``trainer_state.json``), applied to the refs;
- :mod:`.trajectory` -- :class:`Trajectory` (from a folder, the hub or a list), :func:`tokenizer_folder`;
- :mod:`.configs`    -- a checkpoint's config against its weights (function config, meta-device check);
- :mod:`.loader`     -- :class:`CheckpointLoader` (one reused model per config) and :func:`load_model`;
- :mod:`.locate`     -- :func:`open_trajectory` / :func:`open_checkpoint`: a command-line argument (a folder
  or ``hf:ORG/NAME@REVISIONS``) -> trajectory / (trajectory, ref), schedules attached.
"""

from losslens.lm.checkpoints.derived import lawa
from losslens.lm.checkpoints.errors import (
    ArchitectureMismatchError,
    CheckpointError,
    CorruptCheckpointError,
    MissingWeightsError,
    NoCheckpointsError,
    RevisionNotCachedError,
    ScheduleError,
    TrajectoryNameError,
    UnsafeCheckpointError,
)
from losslens.lm.checkpoints.files import local_folder, read_config, weight_files
from losslens.lm.checkpoints.loader import CheckpointLoader, load_model
from losslens.lm.checkpoints.locate import open_checkpoint, open_trajectory, parse_hub_name
from losslens.lm.checkpoints.refs import CheckpointRef, parse_step
from losslens.lm.checkpoints.schedule import PRESETS, Schedule, parse_schedule
from losslens.lm.checkpoints.trajectory import CheckpointProblem, Trajectory, tokenizer_folder

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
    "open_checkpoint",
    "open_trajectory",
    "parse_hub_name",
    "ScheduleError",
    "TrajectoryNameError",
    "Schedule",
    "PRESETS",
    "parse_schedule",
]
