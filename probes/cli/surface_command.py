"""`losslens surface`: the quantization plane of a checkpoint (or a random plane around it) as an
interactive page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from losslens.cli.option_parsing import option_of
from losslens.cli.option_groups import CHECKPOINT_HELP, CheckpointOptions


def _echo_err(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)


def _previous_of(traj, ref):
    """The real checkpoint before ``ref`` in ``traj`` (or None)."""
    real = [r for r in traj if not r.derived]
    i = next((i for i, r in enumerate(real) if r.label == ref.label), 0)
    return real[i - 1] if i > 0 else None


def _where(ref) -> str:
    """Where a checkpoint is, for the page: ``hf:ORG/NAME@REV`` for a hub revision, else its path."""
    return f"hf:{ref.location}@{ref.revision}" if ref.kind == "hub" else str(ref.location or ref.label)


def _check_weights(model, label: str) -> None:
    """Refuse a checkpoint with NaN/inf weights before a grid is spent on it."""
    import torch

    from losslens.geometry.surfaces.moving import SurfaceError

    bad = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        raise SurfaceError(
            f"checkpoint {label} has non-finite (NaN/inf) weights in {len(bad)} tensor(s), e.g. {bad[0]}; "
            "its loss surface would be NaN everywhere. Use a checkpoint from before the divergence."
        )


def _check_surface(surf, checkpoint: Path) -> None:
    """A surface whose marked points or every grid value are non-finite is an error, not a page of holes."""
    import math

    import numpy as np

    from losslens.geometry.surfaces.moving import SurfaceError

    bad = [k for k, (x, y, loss) in surf.points.items() if not all(math.isfinite(v) for v in (x, y, loss))]
    if bad or not np.isfinite(np.asarray(surf.loss, dtype=float)).any():
        raise SurfaceError(
            f"the loss surface of {checkpoint} is not finite (marked point(s) {bad or 'none'} are NaN/inf, "
            f"{surf.n_nonfinite} of {np.asarray(surf.loss).size} grid points non-finite): the weights "
            "of A or B, or the loss on the eval set, are NaN/inf. No page was written."
        )


def checkpoint_surface(
    checkpoint: "str | Path",
    previous: "str | Path | None",
    spec: str,
    grid: int = 31,
    margin: float = 0.25,
    quick: bool = False,
    device: str | None = None,
    resume: Path | None = None,
    progress: bool = True,
    seed: int = 0,
    random_plane: bool = False,
    data: Path | None = None,
    calibration: Path | None = None,
    allow_pickle: bool = False,
    label: str | None = None,
    cache_dir: "str | Path | None" = None,
):
    """The surface ``losslens surface`` draws: the quantization plane A = checkpoint, B = previous,
    C = quantize(A, spec) (:func:`losslens.lm.quant.plane.quantization_surface`), or Li et al.'s random
    plane around A, evaluated on the eval token set on a ``grid``×``grid`` grid.

    ``checkpoint`` / ``previous``: checkpoint arguments of :func:`losslens.lm.checkpoints.open_checkpoint`
    (folders, weight files, ``hf:ORG/NAME@REV``; ``label`` picks A inside a trajectory folder or a
    hub pattern). ``previous=None``: the real checkpoint before A in its trajectory.

    Returns ``(surface, info)`` where ``info`` describes the inputs. Cost: one quantization of A
    plus (grid² + 3) × n_eval_batches forwards. ``data``/``calibration``: TokenSet files to use
    instead of :func:`losslens.lm.data.default_token_sets` (which needs the checkpoint's tokenizer).
    Raises :class:`losslens.geometry.surfaces.moving.SurfaceError` for NaN/inf weights or a non-finite surface, and
    :class:`ArchitectureMismatchError` when B's config differs from A's (one plane, one function).
    """
    import torch

    from losslens.geometry.surfaces.grid import GridSpec
    from losslens.geometry.surfaces.random_planes import random_plane as make_random_plane
    from losslens.geometry.surfaces.surface import evaluate_surface
    from losslens.lm.checkpoints import ArchitectureMismatchError, CheckpointLoader, open_checkpoint
    from losslens.lm.checkpoints.configs import config_differences
    from losslens.lm.core.next_token_loss import lm_loss
    from losslens.lm.core.tokenset import TokenSet
    from losslens.lm.data import default_token_sets
    from losslens.lm.quant.plane import quantization_surface

    gs = GridSpec(resolution=grid, margin=margin)  # bad grids fail before any loading
    traj, ref_a = open_checkpoint(checkpoint, label, cache_dir=cache_dir)
    own = traj.only(ref_a)
    loader = CheckpointLoader(own, device=device, allow_pickle=allow_pickle)
    sets = {"eval": TokenSet.load(data)} if data is not None else default_token_sets(own, quick=quick)
    if calibration is not None:
        sets["calibration"] = TokenSet.load(calibration)
    info = {
        "A (checkpoint)": _where(ref_a),
        "eval set": f"{sets['eval'].name} {tuple(sets['eval'].tokens.shape)} hash {sets['eval'].content_hash[:12]}",
    }
    resume_path = str(resume) if resume else None
    if random_plane:
        model = loader.load(ref_a)
        _check_weights(model, str(checkpoint))
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        plane = make_random_plane(params, seed=seed, label="A")
        info["plane"] = f"random, filter-normalised (Li et al. 2018), seed {seed}"
        with torch.no_grad():
            surf = evaluate_surface(
                model,
                lm_loss,
                sets["eval"],
                plane,
                gs,
                progress=progress,
                checkpoint_path=resume_path,
                merge_batches=True,
            )
        _check_surface(surf, checkpoint)
        return surf, info
    if previous is None:
        prev_ref = _previous_of(traj, ref_a)
        if prev_ref is None:
            raise typer.BadParameter(
                f"no --previous given and no checkpoint before {ref_a.label!r} in {traj.name}: give "
                "--previous (a checkpoint folder or hf:ORG/NAME@REV), or name a hub trajectory "
                "(hf:ORG/NAME@step*) with --label"
            )
    else:
        prev_ref = open_checkpoint(previous, cache_dir=cache_dir)[1]
    diff = config_differences(loader.config(ref_a).to_dict(), loader.config(prev_ref).to_dict())
    if diff:
        raise ArchitectureMismatchError(
            f"--previous {prev_ref.location or prev_ref.label} has a config that differs from "
            f"CHECKPOINT's in {diff}; a plane through both evaluates every point under one "
            "function, so they must share it"
        )
    _check_weights(loader.load(ref_a), str(checkpoint))
    try:
        surf = quantization_surface(loader, ref_a, prev_ref, spec, sets, grid=gs, progress=progress, resume=resume_path)
    except ArchitectureMismatchError as exc:
        raise typer.BadParameter(f"--previous does not match CHECKPOINT: {exc}") from exc
    _check_surface(surf, checkpoint)
    info.update({"B (previous)": _where(prev_ref), "C": f"A quantized with {spec}"})
    return surf, info


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors caused by the inputs (printed as one line, exit code 2) rather than bugs."""
    from losslens.geometry.base.errors import LosslensError

    return (LosslensError, FileNotFoundError)


def surface(
    checkpoint: Annotated[str, typer.Argument(help="Θ_K, the plane's origin A. " + CHECKPOINT_HELP)],
    *,
    previous: Annotated[
        Optional[str],
        typer.Option(
            "--previous",
            "-p",
            help="Previous checkpoint Θ_{K−1} (B): a folder, weight file or hf:ORG/NAME@REV. Default: "
            "the checkpoint before CHECKPOINT in its trajectory.",
        ),
    ] = None,
    label: Annotated[Optional[str], option_of(CheckpointOptions, "label")] = None,
    cache_dir: Annotated[Optional[Path], option_of(CheckpointOptions, "cache_dir")] = None,
    spec: Annotated[
        str, typer.Option("--spec", "-s", help="Quantizer spec giving C = Θ̂_K (e.g. rtn:4:g128, int8, gptq:3:g128).")
    ] = "rtn:4:g128",
    grid: Annotated[int, typer.Option("--grid", "-g", help="Grid points per axis (>= 2).")] = 31,
    margin: Annotated[
        float, typer.Option("--margin", help="Margin around A, B, C as a fraction of their extent.")
    ] = 0.25,
    out: Annotated[Path, typer.Option("--out", "-o", help="Self-contained HTML page to write.")] = Path("surface.html"),
    json_out: Annotated[
        Optional[Path],
        typer.Option("--json", help="Also write the Surface as JSON (input of `losslens report --surface`)."),
    ] = None,
    png: Annotated[
        Optional[Path],
        typer.Option("--png", help="Also write a static PNG (needs kaleido + Chromium; skipped otherwise)."),
    ] = None,
    log: Annotated[bool, typer.Option("--log", help="Colour/height by log10(loss).")] = False,
    quick: Annotated[bool, typer.Option("--quick", help="Small evaluation set (4 batches of 4×64).")] = False,
    data: Annotated[
        Optional[Path],
        typer.Option("--data", help="Evaluation TokenSet file (default: the checkpoint tokenizer's default eval set)."),
    ] = None,
    calibration: Annotated[
        Optional[Path], typer.Option("--calibration", help="Calibration TokenSet file (GPTQ).")
    ] = None,
    random: Annotated[
        bool, typer.Option("--random-plane", help="Li et al. random filter-normalised plane around CHECKPOINT instead.")
    ] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random plane.")] = 0,
    resume: Annotated[
        Optional[Path],
        typer.Option("--resume", help=".npz file of finished grid rows (written as it goes; rerun resumes)."),
    ] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="Device (default cpu; e.g. cuda).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    allow_pickle: Annotated[
        bool,
        typer.Option(
            "--allow-pickle",
            help="Load .bin/.pt checkpoints that need full pickle (can run arbitrary code: only for files you trust).",
        ),
    ] = False,
) -> None:
    """Draw the quantization plane through a checkpoint, its predecessor and its quantized self."""
    from losslens.study.report.pages import export_png, surface_page
    from losslens.study.report.surface_figures import surface_figure

    try:
        surf, info = checkpoint_surface(
            checkpoint,
            previous,
            spec,
            grid=grid,
            margin=margin,
            quick=quick,
            device=device,
            resume=resume,
            progress=not quiet,
            seed=seed,
            random_plane=random,
            data=data,
            calibration=calibration,
            allow_pickle=allow_pickle,
            label=label,
            cache_dir=cache_dir,
        )
    except _user_errors() as exc:
        _echo_err(f"{type(exc).__name__}: {exc}")
        raise typer.Exit(2)
    title = f"loss on the {'random' if random else 'quantization'} plane of {label or Path(checkpoint).name}"
    surface_page(surf, out, title=title, log=log, extra=info)
    if json_out:
        surf.save(json_out)
    for label, (x, y, loss) in surf.points.items():
        typer.echo(f"{label}: (x={x:.5g}, y={y:.5g}) loss {loss:.6f}")
    typer.echo(
        f"{len(surf.x)}×{len(surf.y)} grid in {surf.seconds:.1f} s "
        f"({surf.meta['points_per_second']:.2f} points/s); {surf.n_nonfinite} non-finite point(s)"
    )
    if png:
        ok = export_png(surface_figure(surf, log=log, title=title), png, width=1300, height=560)
        typer.echo(f"PNG {'written to ' + str(png) if ok else 'skipped (kaleido/Chromium unavailable)'}")
    typer.echo(f"wrote {out}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `losslens` app."""
    app.command()(surface)
