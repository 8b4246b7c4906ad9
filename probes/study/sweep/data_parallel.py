"""Data-parallel sweeps (``torchrun … sweep --parallel data``, :func:`losslens.study.sweep.run_sweep`):
the process group and the data every rank must share.

Every rank runs the same plan on the same checkpoints in one process; the Hessian operator splits
the curvature batches over the ranks (:mod:`losslens.geometry.operators.data_parallel`). Rank 0 alone holds the
store; the others build the same token sets (checked by their hash) and follow rank 0's list of
what is left to do, so the collectives of every product line up.
"""

from __future__ import annotations

from losslens.study.sweep.datasets import build_data, data_hashes


def data_parallel_group(parallel: str, executor: str, num_workers, pool, error: type[Exception]):
    """The :class:`~losslens.geometry.operators.data_parallel.DataParallel` of ``parallel="data"`` (None for
    ``"none"``); bad combinations are refused before any work, as ``error`` (the caller's class)."""
    if parallel == "none":
        return None
    if parallel != "data":
        raise error(f"--parallel {parallel!r} is unknown for a sweep; valid: none, data")
    if executor != "local" or pool is not None or (num_workers or 1) > 1:
        raise error("--parallel data runs one local process per rank: leave --executor local and --workers 1")
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise error(
            "--parallel data runs under torchrun: torchrun --nproc_per_node N -m losslens sweep … "
            "--parallel data (no process group is initialised)"
        )
    from losslens.geometry.operators.data_parallel import DataParallel

    return DataParallel()


def sweep_data(group, plan, traj, token_sets, error: type[Exception]):
    """``(token sets, data hash, per-set hashes)``, built on every rank; the ranks agree that it worked
    and that they built the same data."""

    def build():
        sets = dict(token_sets) if token_sets is not None else build_data(plan, traj)
        missing = [n for n in ("eval", "calibration", "curvature") if n not in sets]
        if missing:
            raise error(f"token_sets lacks {missing}; pass eval, calibration and curvature sets")
        return (sets, *data_hashes(sets))

    if group is None:
        return build()
    sets, dhash, per = group.agree(build, "building the sweep's data")
    group.check_same({"data_hash": dhash}, "the sweep's data")
    return sets, dhash, per


__all__ = ["data_parallel_group", "sweep_data"]
