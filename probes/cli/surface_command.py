"""`losslens surface`: the quantization plane of a checkpoint (or a random plane around it) as an
interactive page. The work is :func:`losslens.measure.checkpoint_surface.checkpoint_surface`
(``losslens.surface`` from Python: the surface ``--json`` writes); this command draws it
(:mod:`losslens.study.report.surface_figures`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from losslens.cli.option_groups import CHECKPOINT_HELP, CheckpointOptions, device_option, quiet_option
from losslens.cli.option_parsing import cli, flags, option_of
from losslens.measure.checkpoint_surface import SurfaceSettings

flags(
    SurfaceSettings,
    previous=typer.Option(
        "--previous",
        "-p",
        help="Previous checkpoint Θ_{K−1} (B): a folder, weight file or hf:ORG/NAME@REV. Default: "
        "the checkpoint before CHECKPOINT in its trajectory.",
    ),
    label=option_of(CheckpointOptions, "label"),
    cache_dir=option_of(CheckpointOptions, "cache_dir"),
    spec=typer.Option("--spec", "-s", help="Quantizer spec giving C = Θ̂_K (e.g. rtn:4:g128, int8, gptq:3:g128)."),
    grid=typer.Option("--grid", "-g", help="Grid points per axis (>= 2)."),
    margin=typer.Option("--margin", help="Margin around A, B, C as a fraction of their extent."),
    quick=typer.Option("--quick", help="Small evaluation set (4 batches of 4×64)."),
    data=typer.Option(
        "--data", help="Evaluation TokenSet file (default: the checkpoint tokenizer's default eval set)."
    ),
    calibration=typer.Option("--calibration", help="Calibration TokenSet file (GPTQ)."),
    random_plane=typer.Option(
        "--random-plane", help="Li et al. random filter-normalised plane around CHECKPOINT instead."
    ),
    seed=typer.Option("--seed", help="Seed of the random plane."),
    resume=typer.Option("--resume", help=".npz file of finished grid rows (written as it goes; rerun resumes)."),
    device=device_option("cpu"),
    quiet=quiet_option(),
    allow_pickle=typer.Option(
        "--allow-pickle",
        help="Load .bin/.pt checkpoints that need full pickle (can run arbitrary code: only for files you trust).",
    ),
)


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors caused by the inputs (printed as one line, exit code 2) rather than bugs."""
    from losslens.geometry.base.errors import LosslensError

    return (LosslensError, FileNotFoundError)


def surface(
    checkpoint: Annotated[str, typer.Argument(help="Θ_K, the plane's origin A. " + CHECKPOINT_HELP)],
    *,
    settings: SurfaceSettings = SurfaceSettings(),
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
) -> None:
    """Draw the quantization plane through a checkpoint, its predecessor and its quantized self."""
    from losslens.measure.checkpoint_surface import SurfaceInputError, checkpoint_surface
    from losslens.study.report.pages import export_png, surface_page
    from losslens.study.report.surface_figures import surface_figure

    try:
        surf, info = checkpoint_surface(checkpoint, settings)
    except SurfaceInputError as exc:  # no B, or B not fitting A: typer's usage error
        raise typer.BadParameter(str(exc)) from exc
    except _user_errors() as exc:
        typer.echo(f"error: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(2)
    kind = "random" if settings.random_plane else "quantization"
    title = f"loss on the {kind} plane of {settings.label or Path(checkpoint).name}"
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
    app.command()(cli(surface))
