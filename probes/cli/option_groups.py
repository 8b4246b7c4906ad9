"""Option groups several commands share, each declared once (:mod:`losslens.cli.option_parsing`): how a
trajectory or checkpoint is named and dated (:mod:`losslens.lm.checkpoints.locate`,
:mod:`losslens.lm.checkpoints.schedule`), how its weights are loaded, the memory budget, the HVP
backend and parallelism, and the tolerance of the products' measured error. A command takes a group
as one parameter (``memory: MemoryOptions = MemoryOptions()``); ``--help`` lists the group's fields
as its options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

from losslens.cli.option_parsing import option

TRAJECTORY_HELP = (
    "Trajectory: a folder of checkpoints, or a hub trajectory hf:ORG/NAME@REVISIONS where REVISIONS "
    "is a glob (hf:EleutherAI/pythia-160m@step*), re:REGEX, or a list (@step1000,step2000). "
    "Hub revisions are read from the local Hugging Face cache (only from it when HF_HUB_OFFLINE=1)."
)
CHECKPOINT_HELP = (
    "Checkpoint: a checkpoint folder or weight file, a trajectory folder (--label picks one; default "
    "the last), a hub revision hf:ORG/NAME@REV (hf:EleutherAI/pythia-160m@step143000), or a hub "
    "trajectory hf:ORG/NAME@step* with --label."
)


@dataclass(frozen=True)
class TrajectoryOptions:
    """Where hub revisions are read from, and the LR and tokens each checkpoint is given
    (:func:`losslens.lm.checkpoints.open_trajectory`)."""

    cache_dir: Optional[Path] = option(
        None,
        "--cache-dir",
        help="Hugging Face hub cache holding hf: revisions (default: $HF_HUB_CACHE, $HF_HOME/hub or "
        "~/.cache/huggingface/hub).",
    )
    schedule: Optional[str] = option(
        None,
        "--schedule",
        help="LR schedule giving every checkpoint its LR (and tokens) from its step, replacing recorded values: a "
        "preset (pythia-160m, pythia-70m, ...; pythia-<size>-deduped) or FAMILY:key=value,... with FAMILY "
        "cosine, wsd, linear or constant and keys peak, warmup, total, final, decay, floor, lag, tokens, e.g. "
        "cosine:peak=6e-4,warmup=1430,total=143000,final=0.1.",
    )
    tokens_per_step: Optional[int] = option(
        None,
        "--tokens-per-step",
        min=1,
        help="Tokens per optimizer step (tokens = step × this; Pythia: 2097152 = 1024 × 2048).",
    )


@dataclass(frozen=True)
class CheckpointOptions(TrajectoryOptions):
    """:class:`TrajectoryOptions` and the label that picks one checkpoint of a trajectory
    (:func:`losslens.lm.checkpoints.open_checkpoint`)."""

    label: Optional[str] = option(
        None, "--label", help="Checkpoint label inside a trajectory folder or hub trajectory (default: last)."
    )


@dataclass(frozen=True)
class LoadOptions:
    """How checkpoint weights are loaded (:class:`losslens.lm.checkpoints.CheckpointLoader`)."""

    device: Optional[str] = option(None, "--device")
    dtype: Optional[str] = option(
        None, "--dtype", help="Load the weights as float32 (default), bfloat16, float16 or float64."
    )
    allow_pickle: bool = option(
        False,
        "--allow-pickle",
        help="Load a .bin/.pt checkpoint that needs full pickle (can run arbitrary code: only for files you trust).",
    )


@dataclass(frozen=True)
class MemoryOptions:
    """The memory each curvature estimator may use beyond the model (:mod:`losslens.geometry.memory.model`),
    and whether it is a cap on resident memory (:func:`apply_strict_memory`)."""

    max_memory: Optional[str] = option(
        None,
        "--max-memory",
        help="Memory each estimator may use beyond the model, e.g. 8GB (default: a third of the total RAM / 80% of "
        "the GPU memory not held by the model; what each estimator chose is in the output).",
    )
    strict_memory: Optional[bool] = option(
        None,
        "--strict-memory/--no-strict-memory",
        help="On a CPU, make the memory budget a cap on resident memory: freed tensor memory goes back to the OS at "
        "once (glibc: allocations of 64 kB and more are mapped on their own), so peak RSS above the model stays "
        "within the plan; costs about 1.6-1.7x the time. Default: on when --max-memory is given, off with the "
        "default budget (a third of the RAM), where glibc's kept heap memory fits in the rest "
        '(benchmarks/README.md, "Scale"). Applies to this process and the local sweep workers it starts (not '
        "to Ray's).",
    )

    def apply(self) -> bool:
        """:func:`apply_strict_memory` with these options; call it first thing in a command."""
        return apply_strict_memory(self.strict_memory, self.max_memory)


@dataclass(frozen=True)
class ComputeOptions:
    """How the Hessian-vector products run: the backend (:class:`losslens.geometry.HessianOperator`), the
    compute dtype (:mod:`losslens.geometry.operators.precision`), the ranks under torchrun (:mod:`losslens.lm.core.distributed`) and
    torch's threads."""

    backend: Optional[str] = option(
        "reverse",
        "--backend",
        help="HVP backend: reverse (exact, default) | forward (exact) | difference (gradient differences, first "
        "order only; error measured and recorded) | auto (reverse when its pass fits --max-memory, else "
        "difference)",
    )
    compute_dtype: Optional[str] = option(
        None,
        "--compute-dtype",
        help="dtype the Hessian products run in: float32 | bfloat16 | float16 | float64 (default: float32 for "
        "bfloat16/float16 weights, the weights' dtype otherwise; half arithmetic is off by percents: its "
        "measured error is shown)",
    )
    threads: Optional[int] = option(None, "--threads", help="torch threads (default: torch's).")
    parallel: str = option(
        "none",
        "--parallel",
        help="none | data | fsdp, under torchrun: data splits the curvature batches over the ranks; fsdp also "
        "shards the model, every vector and the estimators' state (FSDP2, gradient differences). Only rank 0 "
        "prints.",
    )


@dataclass(frozen=True)
class ErrorOptions:
    """When a result is flagged for its Hessian products' measured error
    (:func:`losslens.lm.models.curvature.error_warning`), and whether a flagged result fails the command."""

    error_tolerance: float = option(
        1e-2,
        "--error-tolerance",
        help="Relative error of the HVP products (measured against an exact reference) above which a warning is "
        "printed and the result flagged (error_warning).",
    )
    strict: bool = option(
        False,
        "--strict",
        help="Exit with status 1 when the result is flagged (measured product error over --error-tolerance); "
        "default: warn and exit 0.",
    )

    def warn(self, warning: dict | None) -> None:
        """Print a flagged result's one-line warning (error, cause, fix) on stderr; nothing when None."""
        if warning:
            typer.echo(f"warning: {warning['message']}", err=True)

    def exit_if_strict(self, warning: dict | None) -> None:
        """``typer.Exit(1)`` under ``--strict`` when the result is flagged; call it after the output."""
        if self.strict and warning:
            raise typer.Exit(1)


def apply_strict_memory(strict: bool | None, max_memory: str | None = None) -> bool:
    """``--strict-memory`` (``None``: on when ``max_memory`` was given):
    :func:`losslens.geometry.memory.allocator.return_freed_memory` with the 64 kB mmap threshold measured to keep
    peak RSS within the plan (:data:`~losslens.geometry.memory.allocator.STRICT_MMAP_THRESHOLD`). Returns whether
    it is on. Raises ``typer.BadParameter`` when asked for explicitly off glibc, where the setting
    does not exist; when implied by ``--max-memory`` there it is skipped (the budget stays a plan).
    A bad ``max_memory`` is refused first, before any work (``check_max_memory``)."""
    if max_memory is not None:
        check_max_memory(max_memory)
    if strict is False or (strict is None and max_memory is None):
        return False
    from losslens.geometry.memory.allocator import STRICT_MMAP_THRESHOLD, return_freed_memory

    if return_freed_memory(STRICT_MMAP_THRESHOLD):
        return True
    if strict:
        raise typer.BadParameter(
            "needs glibc's malloc (Linux); this process's C library has no mallopt: drop "
            "--strict-memory and leave headroom beyond --max-memory",
            param_hint="--strict-memory",
        )
    return False


def check_max_memory(max_memory: str) -> int:
    """``--max-memory`` in bytes, read by the one size parser (:func:`losslens.geometry.memory.model.parse_bytes`:
    a number and a unit, from 1 MB to this machine's memory); ``typer.BadParameter`` naming the option
    and saying what was read and what is accepted otherwise."""
    from losslens.geometry.memory.model import MemoryBudgetError, parse_bytes

    try:
        return parse_bytes(max_memory)
    except MemoryBudgetError as exc:
        raise typer.BadParameter(str(exc), param_hint="--max-memory") from None


__all__ = [
    "CHECKPOINT_HELP",
    "TRAJECTORY_HELP",
    "CheckpointOptions",
    "ComputeOptions",
    "ErrorOptions",
    "LoadOptions",
    "MemoryOptions",
    "TrajectoryOptions",
    "apply_strict_memory",
    "check_max_memory",
]
