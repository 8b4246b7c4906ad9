"""Where an estimator's large solver state lives: the device, host RAM (pinned), or local disk (issue #48).

A Lanczos basis or a Hutch++ sketch is ``m`` full-dim rows; at 32B parameters over 8 ranks one row
is 17.5 GB per rank in float32, so a basis of 8 does not fit beside the model on an 80 GB GPU. The
estimators take ``basis_device``: the operator's device (default), ``"cpu"`` (host RAM; pinned when
the operator is on a GPU, so the chunks the projections move go by DMA) or :data:`DISK` (a file on
local disk, memory-mapped, for a host that cannot hold it either, or a CPU run whose RAM cannot).
Rows kept off the device are streamed a chunk at a time by the linear algebra of
``losslens.geometry.base._linalg`` (``gram``, ``combine_into``): no full-size copy on the device.

:func:`state_rows` allocates a ``[rows, dim]`` block there. A disk block is a memory-mapped file in
``$LOSSLENS_STATE_DIR`` (default: the system's temporary directory), unlinked as soon as it is mapped:
its space is returned when the tensor is freed, also if the process dies. :data:`DISK_USE` counts the
bytes of live disk blocks (``live``, ``peak``), which the memory tests compare with the plan's host
parts. Transfer rates the plans price the traffic at: :data:`HOST_LINK_BYTES_PER_S`,
:data:`DISK_BYTES_PER_S` (assumed, not measured here; :func:`transfer_seconds`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref

import numpy as np
import torch

__all__ = [
    "DISK",
    "DISK_USE",
    "HOST_LINK_BYTES_PER_S",
    "DISK_BYTES_PER_S",
    "state_dir",
    "state_rows",
    "disk_free_bytes",
    "transfer_seconds",
    "state_transfer",
]

#: ``basis_device`` value for solver state on local disk (memory-mapped).
DISK = "disk"
#: Environment variable naming the directory of disk-held state.
STATE_DIR_ENV = "LOSSLENS_STATE_DIR"
#: Host-to-GPU bytes per second from pinned memory the plans assume (PCIe 4.0 x16 in practice; 5.0
#: doubles it). An assumption for the plan's time column, not a measurement on this machine.
HOST_LINK_BYTES_PER_S = 25e9
#: Bytes per second read from local NVMe the plans assume (sequential, one rank; an assumption).
DISK_BYTES_PER_S = 2e9


class _DiskUse:
    """Bytes of live memory-mapped state blocks in this process: ``live`` now, ``peak`` since :meth:`reset`."""

    def __init__(self) -> None:
        self.live = self.peak = 0

    def reset(self) -> None:
        self.peak = self.live

    def _add(self, n: int) -> None:
        self.live += n
        self.peak = max(self.peak, self.live)

    def _free(self, n: int) -> None:
        self.live -= n


#: Bytes of solver state on local disk now, and the most at once (process-wide).
DISK_USE = _DiskUse()


def state_dir() -> str:
    """The directory of disk-held state: ``$LOSSLENS_STATE_DIR`` or the system's temporary directory."""
    return os.environ.get(STATE_DIR_ENV, "").strip() or tempfile.gettempdir()


def disk_free_bytes() -> int:
    """Free bytes in :func:`state_dir` (the budget of disk-held state)."""
    return int(shutil.disk_usage(state_dir()).free)


def state_rows(rows: int, dim: int, dtype: torch.dtype, where, pin: bool = False) -> torch.Tensor:
    """An uninitialised ``[rows, dim]`` tensor of ``dtype`` on device ``where``, or on local disk
    (``where == DISK``: a memory-mapped file, read and written like a CPU tensor); ``pin``: page-locked
    host memory (for state on the host of an operator on a GPU; ignored elsewhere)."""
    if where == DISK:
        nbytes = rows * dim * torch.empty((), dtype=dtype).element_size()
        fd, path = tempfile.mkstemp(prefix="losslens-state-", dir=state_dir())
        try:
            os.close(fd)
            mapped = np.memmap(path, dtype=np.uint8, mode="w+", shape=(max(nbytes, 1),))
        finally:
            os.unlink(path)  # the mapping keeps the space until the tensor is freed
        out = torch.from_numpy(mapped)[:nbytes].view(dtype).view(rows, dim)
        DISK_USE._add(nbytes)
        weakref.finalize(out.untyped_storage(), DISK_USE._free, nbytes)
        return out
    device = torch.device(where)
    if pin and device.type == "cpu" and torch.cuda.is_available():
        return torch.empty(rows, dim, dtype=dtype, pin_memory=True)
    return torch.empty(rows, dim, dtype=dtype, device=device)


def transfer_seconds(nbytes: float, where, op_device) -> float:
    """Seconds to move ``nbytes`` between state held at ``where`` and an operator on ``op_device`` at
    the assumed rates: 0 when both are the host's memory (a CPU operator with state in RAM)."""
    if where == DISK:
        return float(nbytes) / DISK_BYTES_PER_S
    if torch.device(where).type == torch.device(op_device).type:
        return 0.0
    return float(nbytes) / HOST_LINK_BYTES_PER_S


def state_transfer(nbytes: float, where, op_device) -> dict:
    """A plan's ``transfer`` entry (``losslens.geometry.memory.model.MemoryEstimate``) for ``nbytes``
    moved between state at ``where`` and an operator on ``op_device``; {} when nothing crosses a link."""
    seconds = transfer_seconds(nbytes, where, op_device)
    if seconds == 0.0:
        return {}
    return {"bytes": int(nbytes), "seconds": seconds, "where": "disk" if where == DISK else "cpu"}
