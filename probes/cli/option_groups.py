"""The command-line flags of the settings objects several commands share (:mod:`losslens.lm.shared_settings`: their
fields, defaults and checks; :mod:`losslens.cli.option_parsing`): how a
trajectory or checkpoint is named and dated (:mod:`losslens.lm.checkpoints.locate`,
:mod:`losslens.lm.checkpoints.schedule`), how its weights are loaded, the memory budget, the HVP
backend and parallelism, and the tolerance of the products' measured error. A command takes a group
as one parameter (``memory: MemoryOptions = MemoryOptions()``); ``--help`` lists the group's fields
as its options. ``-q/--quiet`` and ``--threads``, fields of many commands' own settings, are declared here once
(:func:`quiet_option`, :func:`threads_option`)."""

from __future__ import annotations

import typer
from losslens.cli.option_parsing import flag_of, flags, long_help
from losslens.geometry.operators.names import backend_help
from losslens.lm import shared_settings as settings
from losslens.lm.shared_settings import (
    CheckpointOptions,
    ComputeOptions,
    ErrorOptions,
    LoadOptions,
    MemoryOptions,
    StateOptions,
    TrajectoryOptions,
)

TRAJECTORY_DETAILS = (
    "Trajectory: a folder of checkpoints, or a hub trajectory hf:ORG/NAME@REVISIONS where REVISIONS "
    "is a glob (hf:EleutherAI/pythia-160m@step*), re:REGEX, or a list (@step1000,step2000). "
    "Hub revisions are read from the local Hugging Face cache (only from it when HF_HUB_OFFLINE=1)."
)
CHECKPOINT_DETAILS = (
    "Checkpoint: a checkpoint folder or weight file, a trajectory folder (--label picks one; default "
    "the last), a hub revision hf:ORG/NAME@REV (hf:EleutherAI/pythia-160m@step143000), or a hub "
    "trajectory hf:ORG/NAME@step* with --label."
)
TRAJECTORY_HELP = long_help("Folder of checkpoints or hf:ORG/NAME@step* (see --help-all).", TRAJECTORY_DETAILS)
CHECKPOINT_HELP = long_help("Checkpoint folder/file, trajectory folder, or hf:ORG/NAME@REV.", CHECKPOINT_DETAILS)

# --help shows the short help of each option (one line at 80 columns); --help-all the long one (long_help)
_LONG = dict(
    cache_dir="Hugging Face hub cache holding hf: revisions (default: $HF_HUB_CACHE, $HF_HOME/hub or "
    "~/.cache/huggingface/hub).",
    schedule="LR schedule giving every checkpoint its LR (and tokens) from its step, replacing recorded values: a "
    "preset (pythia-160m, pythia-70m, ...; pythia-<size>-deduped) or FAMILY:key=value,... with FAMILY "
    "cosine, wsd, linear or constant and keys peak, warmup, total, final, decay, floor, lag, tokens, e.g. "
    "cosine:peak=6e-4,warmup=1430,total=143000,final=0.1.",
    tokens_per_step="Tokens per optimizer step (tokens = step × this; Pythia: 2097152 = 1024 × 2048).",
    label="Checkpoint label inside a trajectory folder or hub trajectory (default: last).",
    allow_pickle="Load a .bin/.pt checkpoint that needs full pickle (can run arbitrary code: only for files you "
    "trust).",
    max_memory="Memory each estimator may use beyond the model, e.g. 8GB (default: a third of the total RAM / 80% "
    "of the GPU memory not held by the model; what each estimator chose is in the output).",
    strict_memory="On a CPU, make the memory budget a cap on resident memory: freed tensor memory goes back to the "
    "OS at once (glibc: allocations of 64 kB and more are mapped on their own), so peak RSS above the model stays "
    "within the plan; costs about 1.6-1.7x the time. Default: on when --max-memory is given, off with the "
    "default budget (a third of the RAM), where glibc's kept heap memory fits in the rest "
    '(benchmarks/README.md, "Scale"). Applies to this process and the local sweep workers it starts (not '
    "to Ray's).",
    backend=backend_help(),
    compute_dtype="dtype the Hessian products run in: float32 | bfloat16 | float16 | float64 (default: float32 for "
    "bfloat16/float16 weights, the weights' dtype otherwise; half arithmetic is off by percents: its "
    "measured error is shown)",
    parallel="none | data | fsdp, under torchrun: data splits the curvature batches over the ranks; fsdp also "
    "shards the model, every vector and the estimators' state (FSDP2, gradient differences). Only rank 0 "
    "prints.",
    state_device="Where the estimators' large state lives, a Lanczos basis or a Hutch++ sketch: device (the "
    "operator's), cpu (host RAM, pinned when the model is on a GPU) or disk (memory-mapped in $LOSSLENS_STATE_DIR, "
    "default the temporary folder); off the device it is streamed a chunk at a time, and the memory plan counts it "
    "against host RAM or free disk with its transfer time. The numbers do not change.",
    master_device="With --parallel fsdp: where the copy of θ that restores the shards after each perturbation "
    "lives: device, or cpu (host RAM, pinned on a GPU: moved in a tensor at a time per perturbation; its bytes "
    "leave the device's plan).",
    error_tolerance="Relative error of the HVP products (measured against an exact reference) above which a "
    "warning is printed and the result flagged (error_warning).",
    strict="Exit with status 1 when the result is flagged (measured product error over --error-tolerance); "
    "default: warn and exit 0.",
)

QUIET_HELP = "No progress output on stderr."
"""The help of ``-q/--quiet`` in every command."""


def quiet_option() -> typer.models.OptionInfo:
    """The one declaration of ``-q/--quiet`` (a settings field ``quiet: bool = False``): ``quiet=quiet_option()``
    in a command's :func:`~losslens.cli.option_parsing.flags`."""
    return typer.Option("--quiet", "-q", help=QUIET_HELP)


def threads_help(default: str) -> str:
    """The help of ``--threads``; ``default``: what the command does without it (the field's default)."""
    return f"torch threads per process (default: {default})."


def device_help(default: str) -> str:
    """``--device``'s one help text, ``default`` saying what the command does without it."""
    return f"torch device, e.g. cuda, cpu (default: {default})."


def device_option(default: str) -> typer.models.OptionInfo:
    """The one declaration of ``--device`` (a settings field ``device: Optional[str]``, None: the
    command's default, which ``default`` names in the help)."""
    return typer.Option("--device", help=device_help(default))


def threads_option(default: str) -> typer.models.OptionInfo:
    """The one declaration of ``--threads`` (a settings field ``threads: Optional[int]``, at least 0; 0 and None
    leave torch's count unless ``default`` says otherwise): ``threads=threads_option("torch's")`` in a command's
    :func:`~losslens.cli.option_parsing.flags`, ``default`` saying what the field's default does there (the help
    says it; typer's ``[default: ...]`` is not shown)."""
    return typer.Option("--threads", min=0, show_default=False, help=threads_help(default))


flags(
    TrajectoryOptions,
    cache_dir=typer.Option("--cache-dir", help=long_help("Hugging Face hub cache for hf: names.", _LONG["cache_dir"])),
    schedule=typer.Option(
        "--schedule", help=long_help("LR schedule: preset or FAMILY:key=value,...", _LONG["schedule"])
    ),
    tokens_per_step=typer.Option(
        "--tokens-per-step", min=1, help=long_help("Tokens per optimizer step.", _LONG["tokens_per_step"])
    ),
)

flags(
    CheckpointOptions,
    **{f: flag_of(TrajectoryOptions, f) for f in ("cache_dir", "schedule", "tokens_per_step")},
    label=typer.Option("--label", help=long_help("Checkpoint label in a trajectory (default: last).", _LONG["label"])),
)

flags(
    LoadOptions,
    device=device_option("the command's"),
    dtype=typer.Option("--dtype", help="Weights dtype: float32 | bfloat16 | float16 | float64."),
    allow_pickle=typer.Option(
        "--allow-pickle", help=long_help("Allow .bin/.pt files that need full pickle.", _LONG["allow_pickle"])
    ),
)

flags(
    MemoryOptions,
    max_memory=typer.Option(
        "--max-memory", help=long_help("Memory per estimator beyond the model, e.g. 8GB.", _LONG["max_memory"])
    ),
    strict_memory=typer.Option(
        "--strict-memory/--no-strict-memory",
        help=long_help("Make --max-memory a cap on resident memory (CPU).", _LONG["strict_memory"]),
    ),
)

flags(
    StateOptions,
    state_device=typer.Option(
        "--state-device",
        help=long_help("Lanczos basis / Hutch++ sketch: device | cpu | disk.", _LONG["state_device"]),
    ),
    master_device=typer.Option(
        "--master-device", help=long_help("Sharded θ copy: device | cpu (--parallel fsdp).", _LONG["master_device"])
    ),
)

flags(
    ComputeOptions,
    backend=typer.Option(
        "--backend", help=long_help("HVP backend: reverse | forward | difference | auto.", _LONG["backend"])
    ),
    compute_dtype=typer.Option(
        "--compute-dtype", help=long_help("dtype the Hessian products run in.", _LONG["compute_dtype"])
    ),
    threads=threads_option("torch's"),
    parallel=typer.Option("--parallel", help=long_help("none | data | fsdp (under torchrun).", _LONG["parallel"])),
)

flags(
    ErrorOptions,
    error_tolerance=typer.Option(
        "--error-tolerance", help=long_help("HVP relative error above which to warn.", _LONG["error_tolerance"])
    ),
    strict=typer.Option("--strict", help=long_help("Exit 1 when the result is flagged.", _LONG["strict"])),
)


def apply_strict_memory(strict: bool | None, max_memory: str | None = None) -> bool:
    """:func:`losslens.lm.shared_settings.apply_strict_memory`, its :class:`~losslens.lm.shared_settings.SettingsError`
    raised as ``typer.BadParameter`` naming the option."""
    try:
        return settings.apply_strict_memory(strict, max_memory)
    except settings.SettingsError as exc:
        hint = "--max-memory" if str(exc).startswith("--max-memory") else "--strict-memory"
        raise typer.BadParameter(str(exc).removeprefix("--max-memory: "), param_hint=hint) from None


def check_max_memory(max_memory: str) -> int:
    """:func:`losslens.lm.shared_settings.check_max_memory`, its error raised as ``typer.BadParameter``."""
    try:
        return settings.check_max_memory(max_memory)
    except settings.SettingsError as exc:
        raise typer.BadParameter(str(exc).removeprefix("--max-memory: "), param_hint="--max-memory") from None


def warn_flagged(warning: dict | None) -> None:
    """Print a flagged result's one-line warning (error, cause, fix) on stderr; nothing when None."""
    if warning:
        typer.echo(f"warning: {warning['message']}", err=True)


def exit_if_strict(errors: ErrorOptions, warning: dict | None) -> None:
    """``typer.Exit(1)`` under ``--strict`` when the result is flagged; call it after the output."""
    if errors.strict and warning:
        raise typer.Exit(1)


__all__ = [
    "CHECKPOINT_DETAILS",
    "CHECKPOINT_HELP",
    "QUIET_HELP",
    "TRAJECTORY_DETAILS",
    "TRAJECTORY_HELP",
    "CheckpointOptions",
    "ComputeOptions",
    "ErrorOptions",
    "LoadOptions",
    "MemoryOptions",
    "StateOptions",
    "TrajectoryOptions",
    "apply_strict_memory",
    "check_max_memory",
    "exit_if_strict",
    "quiet_option",
    "threads_help",
    "threads_option",
    "warn_flagged",
]
