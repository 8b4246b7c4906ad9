"""Process groups for the CLI's ``--parallel data|fsdp`` (under ``torchrun``), and which rank speaks.

``torchrun --nproc_per_node N -m losslens sharpness … --parallel data`` starts N processes with
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set.
:func:`init_data_parallel` joins them into one ``torch.distributed`` group: NCCL when CUDA is
available (each rank on ``cuda:LOCAL_RANK``), gloo otherwise; with a timeout, so a rank that dies
makes the others fail instead of waiting forever. Only rank 0 prints and writes files
(:func:`is_main_rank`). The products themselves are :mod:`losslens.geometry.operators.data_parallel`.
"""

from __future__ import annotations

import atexit
import datetime
import os

import torch

from losslens.geometry.base.errors import LosslensError

#: Seconds a collective may wait for the other ranks before the process group gives up
#: (``$LOSSLENS_DIST_TIMEOUT`` overrides it).
DEFAULT_TIMEOUT_S = 1800.0
TIMEOUT_ENV = "LOSSLENS_DIST_TIMEOUT"
PARALLEL_MODES = ("none", "data", "fsdp")


class DistributedError(LosslensError, RuntimeError):
    """``--parallel data|fsdp`` asked for outside ``torchrun``, or a process group that cannot start."""


def torchrun_env() -> tuple[int, int, int] | None:
    """``(rank, world_size, local_rank)`` from torchrun's environment, or None outside torchrun."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError as exc:
        raise DistributedError(f"RANK / WORLD_SIZE / LOCAL_RANK must be integers: {exc}") from None


def init_data_parallel(
    timeout_s: float | None = None, device: str | None = None, mode: str = "data", command: str = "sharpness"
) -> tuple[int, int, str]:
    """Join (or reuse) the default process group; returns ``(rank, world_size, device)``.

    ``device``: None picks ``cuda:LOCAL_RANK`` when CUDA is available, else ``cpu``; the backend is
    NCCL for CUDA devices, gloo for CPU. ``timeout_s``: how long a collective waits for a rank
    (default ``$LOSSLENS_DIST_TIMEOUT``, else :data:`DEFAULT_TIMEOUT_S`). Raises
    :class:`DistributedError` outside ``torchrun`` (or an already initialised group); its message names
    the ``--parallel`` ``mode`` and the CLI ``command`` the user ran.
    """
    if timeout_s is None:
        try:
            timeout_s = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
        except ValueError:
            raise DistributedError(
                f"{TIMEOUT_ENV} must be a number of seconds, got {os.environ[TIMEOUT_ENV]!r}"
            ) from None
    import torch.distributed as dist

    if not dist.is_available():
        raise DistributedError(f"this torch build has no torch.distributed: --parallel {mode} cannot run")
    if dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        local = int(os.environ.get("LOCAL_RANK", "0"))
    else:
        env = torchrun_env()
        if env is None:
            raise DistributedError(
                f"--parallel {mode} runs under torchrun: torchrun --nproc_per_node N -m losslens "
                f"{command} … --parallel {mode} (RANK and WORLD_SIZE are not set)"
            )
        rank, world, local = env
    if device is None:
        device = f"cuda:{local}" if torch.cuda.is_available() else "cpu"
    if not dist.is_initialized():
        backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(torch.device(device))
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=float(timeout_s)))
        atexit.register(_leave_group)
    return rank, world, device


def _leave_group() -> None:
    """At exit, destroy the group this module created: left to interpreter shutdown, gloo's worker
    threads were seen to abort a finished rank ("terminate called without an active exception")."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def is_main_rank() -> bool:
    """True outside a process group and on rank 0 inside one: the process that prints and writes."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


__all__ = [
    "init_data_parallel",
    "is_main_rank",
    "torchrun_env",
    "DistributedError",
    "DEFAULT_TIMEOUT_S",
    "PARALLEL_MODES",
]
