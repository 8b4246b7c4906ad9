"""Options that several commands share: how a trajectory or checkpoint is named, the hub cache,
and the schedule that gives hub revisions their LR and tokens (one text, one parser:
:mod:`probes.checkpoints.locate` and :mod:`probes.checkpoints.schedule`)."""
from __future__ import annotations

import typer

TRAJECTORY_HELP = ("Trajectory: a folder of checkpoints, or a hub trajectory hf:ORG/NAME@REVISIONS where REVISIONS "
                   "is a glob (hf:EleutherAI/pythia-160m@step*), re:REGEX, or a list (@step1000,step2000). "
                   "Hub revisions are read from the local Hugging Face cache (only from it when HF_HUB_OFFLINE=1).")
CHECKPOINT_HELP = ("Checkpoint: a checkpoint folder or weight file, a trajectory folder (--label picks one; default "
                   "the last), a hub revision hf:ORG/NAME@REV (hf:EleutherAI/pythia-160m@step143000), or a hub "
                   "trajectory hf:ORG/NAME@step* with --label.")


def cache_dir_option():
    return typer.Option(None, "--cache-dir", help="Hugging Face hub cache holding hf: revisions (default: $HF_HUB_CACHE, "
                                                  "$HF_HOME/hub or ~/.cache/huggingface/hub).")


def schedule_option():
    return typer.Option(None, "--schedule", help="LR schedule giving every checkpoint its LR (and tokens) from its step, "
                                                 "replacing recorded values: a preset (pythia-160m, pythia-70m, ...; "
                                                 "pythia-<size>-deduped) or FAMILY:key=value,... with FAMILY cosine, wsd, "
                                                 "linear or constant and keys peak, warmup, total, final, decay, floor, "
                                                 "lag, tokens, e.g. cosine:peak=6e-4,warmup=1430,total=143000,final=0.1.")


def tokens_option():
    return typer.Option(None, "--tokens-per-step", min=1, help="Tokens per optimizer step (tokens = step × this; "
                                                               "Pythia: 2097152 = 1024 × 2048).")


def label_option():
    return typer.Option(None, "--label", help="Checkpoint label inside a trajectory folder or hub trajectory (default: last).")


def backend_option():
    return typer.Option("reverse", "--backend", help="HVP backend: reverse (exact, default) | forward (exact) | "
                        "difference (gradient differences, first order only; error measured and recorded) | auto "
                        "(reverse when its pass fits --max-memory, else difference)")


def compute_dtype_option():
    return typer.Option(None, "--compute-dtype", help="dtype the Hessian products run in: float32 | bfloat16 | float16 | "
                        "float64 (default: float32 for bfloat16/float16 weights, the weights' dtype otherwise; half "
                        "arithmetic is off by percents: its measured error is shown)")


def strict_memory_option():
    return typer.Option(None, "--strict-memory/--no-strict-memory", help="On a CPU, make the memory budget a cap "
                        "on resident memory: freed tensor memory goes back to the OS at once (glibc: allocations "
                        "of 64 kB and more are mapped on their own), so peak RSS above the model stays within the "
                        "plan; costs about 1.6-1.7x the time. Default: on when --max-memory is given, off with the "
                        "default budget (a third of the RAM), where glibc's kept heap memory fits in the rest "
                        "(benchmarks/README.md, \"Scale\"). Applies to this process and the local sweep workers it starts (not to Ray's).")


def apply_strict_memory(strict: bool | None, max_memory: str | None = None) -> bool:
    """``--strict-memory`` (``None``: on when ``max_memory`` was given):
    :func:`geometry.memory.allocator.return_freed_memory` with the 64 kB mmap threshold measured to keep
    peak RSS within the plan (:data:`~geometry.memory.allocator.STRICT_MMAP_THRESHOLD`). Returns whether
    it is on. Raises ``typer.BadParameter`` when asked for explicitly off glibc, where the setting
    does not exist; when implied by ``--max-memory`` there it is skipped (the budget stays a plan)."""
    if strict is False or (strict is None and max_memory is None):
        return False
    from geometry.memory.allocator import STRICT_MMAP_THRESHOLD, return_freed_memory

    if return_freed_memory(STRICT_MMAP_THRESHOLD):
        return True
    if strict:
        raise typer.BadParameter("needs glibc's malloc (Linux); this process's C library has no mallopt: drop "
                                 "--strict-memory and leave headroom beyond --max-memory", param_hint="--strict-memory")
    return False


def register(app: typer.Typer) -> None:  # no commands here; probes.cli registers every module of this package
    return None
