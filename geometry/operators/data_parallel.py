"""Data-parallel Hessian products through ``torch.distributed`` (docs/science.md §4).

Each rank holds the whole model and its own share of the curvature batches. A product is the
batch-weighted sum over *all* batches of all ranks,

    H v = Σ_r Σ_{b ∈ rank r} w_b H_b v,      w_b = raw_b / Σ_{all ranks} raw,

computed locally and then summed by one ``all_reduce`` of the ``[k, dim]`` result. The weights are
normalised by the global total, so the product equals one process's over the same batches whatever
the split (up to the order of floating-point summation). Estimators run unchanged and identically on
every rank: their random vectors come from the same seeds, and every collective result is the same
on every rank, so their linear algebra and decisions agree without further communication.

Failures never hang and never stay on one rank: each rank's local work is wrapped in
:meth:`DataParallel.agree`, which exchanges an ok/failed flag (one small ``all_reduce``) before any
data collective; when a rank failed, every rank raises :class:`RankError` naming the rank and its
one-line message. A rank that dies outright is caught by the process group's timeout (set by
whoever initialises it: ``losslens.lm.core.distributed.init_data_parallel``). The same code runs on
gloo (CPU) and NCCL (GPUs): collectives take tensors on the operator's device.

Cost per ``matmat`` of k vectors: the local products, plus one ``all_reduce`` of k·dim numbers in the
vector dtype and one of a single flag. Memory: one [k, dim] buffer beyond the single-process pass
(the reduction is in place on the result).
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Sequence

import torch

from losslens.geometry.base.batches import raw_batch_weights
from losslens.geometry.memory.budget import default_budget
from losslens.geometry.operators.interface import OperatorError


class RankError(OperatorError):
    """Raised on every rank when one or more ranks failed; names them and their messages."""


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


class DataParallel:
    """A process group for data-parallel products (default: the world group).

    Args:
        group: a ``torch.distributed`` process group, or None for the default (world) group, which
            must already be initialised (``torch.distributed.init_process_group``; under
            ``torchrun`` the CLI does this with ``--parallel data``).
    """

    def __init__(self, group: Any = None):
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise OperatorError(
                "data-parallel products need an initialised torch.distributed process group: run under torchrun "
                "and call torch.distributed.init_process_group first (losslens' CLI does it for --parallel data)"
            )
        self._dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.backend = str(dist.get_backend(group))

    def __repr__(self) -> str:
        return f"DataParallel(rank={self.rank}, world_size={self.world_size}, backend={self.backend!r})"

    def _device(self, device: torch.device) -> torch.device:
        # NCCL reduces CUDA tensors only; gloo takes CPU tensors (and CUDA ones through a copy)
        return device if self.backend == "nccl" else torch.device("cpu")

    # ------------------------------------------------------------------ collectives
    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the ranks, in place (it must be contiguous); returns it."""
        if not tensor.is_contiguous():
            raise OperatorError("all_reduce_ needs a contiguous tensor")
        dev = self._device(tensor.device)
        if dev == tensor.device:
            self._dist.all_reduce(tensor, group=self.group)
            return tensor
        buf = tensor.to(dev)
        self._dist.all_reduce(buf, group=self.group)
        tensor.copy_(buf)
        return tensor

    def sum_floats(self, values: Sequence[float], device: torch.device | str = "cpu") -> list[float]:
        """Element-wise sum over the ranks of a few floats (float64)."""
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self._device(torch.device(device)))
        self._dist.all_reduce(t, group=self.group)
        return [float(x) for x in t.tolist()]

    def max_int(self, value: int, device: torch.device | str = "cpu") -> int:
        """The largest of one integer over the ranks."""
        t = torch.tensor([int(value)], dtype=torch.int64, device=self._device(torch.device(device)))
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self.group)
        return int(t.item())

    def min_int(self, value: int, device: torch.device | str = "cpu") -> int:
        """The smallest of one integer over the ranks."""
        return -self.max_int(-int(value), device)

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        out: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(out, obj, group=self.group)
        return out

    def planned_pass_bytes(self, need: int, k: int, dim: int, dtype: torch.dtype, device: torch.device) -> int:
        """A product's planned bytes on every rank: the largest ``need`` of any rank (so all make the
        same choices), plus the all-reduce's staging copy of the ``[k, dim]`` result where the
        backend cannot reduce in place (collective)."""
        staging = k * dim * torch.empty((), dtype=dtype).element_size() if self._device(device) != device else 0
        return self.max_int(need + staging, device)

    # ------------------------------------------------------------------ agreement
    def agree(self, fn: Callable[[], Any], what: str, device: torch.device | str = "cpu") -> Any:
        """Run ``fn()`` on this rank, then make the ranks agree that all succeeded.

        Every rank calls this the same number of times in the same order. If ``fn`` raised on any
        rank, every rank raises :class:`RankError` ("``what`` failed on rank 1 of 2: …"), chained
        to the local exception where there was one; otherwise ``fn``'s result is returned.
        """
        error: BaseException | None = None
        result: Any = None
        try:
            result = fn()
        except Exception as exc:  # re-raised below, on every rank, after the agreement
            error = exc
        if self.max_int(1 if error is not None else 0, device):
            messages = self.gather_objects(None if error is None else _one_line(error))
            failed = [(r, m) for r, m in enumerate(messages) if m is not None]
            detail = "; ".join(f"rank {r}: {m}" for r, m in failed)
            ranks = ", ".join(str(r) for r, _ in failed)
            raise RankError(f"{what} failed on rank {ranks} of {self.world_size}: {detail}") from error
        return result

    def check_same(self, fields: dict[str, Any], what: str) -> None:
        """Raise :class:`RankError` on every rank unless ``fields`` are equal on all ranks (the plan
        each rank was given: dims, parameter names, dtypes)."""
        digest = hashlib.sha256(repr(sorted(fields.items())).encode()).hexdigest()
        digests = self.gather_objects(digest)
        if len(set(digests)) > 1:
            every = self.gather_objects(fields)
            diffs = [
                f"{key}: " + ", ".join(f"rank {r}={every[r].get(key)!r}" for r in range(self.world_size))
                for key in fields
                if len({repr(e.get(key)) for e in every}) > 1
            ]
            raise RankError(
                f"{what} differs between ranks ({'; '.join(diffs)}): every rank must build the same "
                "operator (same model, parameter selection and dtype)"
            )


def global_batch_weights(
    parallel: DataParallel, batches: Sequence[Any], raw: Sequence[float], device: torch.device
) -> tuple[float, ...]:
    """This rank's batch weights normalised by the sum of the raw weights over *every* rank's
    batches (so products equal one process's over all batches). Raises :class:`RankError` on every
    rank when a rank has no batch or the weights sum to zero."""
    counts = parallel.gather_objects(len(batches))
    empty = [r for r, n in enumerate(counts) if n == 0]
    if empty:
        raise RankError(
            f"rank {', '.join(map(str, empty))} of {parallel.world_size} got no curvature batch "
            f"({sum(counts)} batches over {parallel.world_size} ranks): give every rank at least one "
            "batch (more batches, or fewer processes)"
        )
    (total,) = parallel.sum_floats([sum(raw)], device)
    if total <= 0:
        raise RankError("batch weights sum to zero over all ranks")
    return tuple(float(w) / total for w in raw)


def join_data_parallel(op: Any, spec: Any, weights: Sequence[float] | None) -> DataParallel:
    """Make a just-built :class:`~losslens.geometry.operators.hessian.HessianOperator` data-parallel
    (collectives: every rank calls this). ``spec``: ``True`` (the default group), a process group
    or a :class:`DataParallel`. Checks every rank built the same operator, sets ``op.weights`` to
    this rank's weights normalised over all ranks' batches, and ``op.max_memory`` (when None) to
    the smallest default budget over the ranks, so every rank makes the same memory plan."""
    pg = spec if isinstance(spec, DataParallel) else DataParallel(None if spec is True else spec)
    pg.check_same(
        {"dim": op.dim, "names": list(op.space.names), "dtype": str(op.param_dtype), "backend": op.backend},
        "the Hessian operator",
    )
    raw = pg.agree(
        lambda: raw_batch_weights(op.batches, weights, OperatorError, op.loss_fn),
        "checking the batch weights",
        op.device,
    )
    op.weights = global_batch_weights(pg, op.batches, raw, op.device)
    if op.max_memory is None:
        op.max_memory = pg.min_int(default_budget(op.device), op.device)
    return pg


def split_batches(batches: Sequence[Any], rank: int, world_size: int) -> list[Any]:
    """Rank ``rank``'s contiguous share of ``batches``: the first ``n mod world_size`` ranks take one
    more (3 batches over 2 ranks: [0, 1] and [2]). Raises ``ValueError`` when there are fewer
    batches than ranks."""
    n = len(batches)
    if n < world_size:
        raise OperatorError(
            f"{n} curvature batches cannot be split over {world_size} ranks: every rank needs at least "
            "one batch (build more batches, or run fewer processes)"
        )
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return list(batches[start : start + base + (1 if rank < extra else 0)])


__all__ = ["DataParallel", "RankError", "global_batch_weights", "join_data_parallel", "split_batches"]
