"""`losslens landscape TRAJ [TRAJ ...] --spec SPEC --grid N --out PAGE.html [--json]`: the loss over
the principal plane of whole trajectories, with every checkpoint's quantized point on it
(:func:`losslens.study.landscape.trajectory_landscape.trajectory_landscape`), as an interactive page.

Several trajectories (a run and its forks, runs of a grid) go into one PCA; ``--json`` prints
:meth:`~losslens.study.landscape.trajectory_landscape.Landscape.describe` (explained variance ratios, every point's
coordinates, residuals and losses). The work is
:func:`losslens.study.landscape.trajectory_landscapes.landscape_of` (``losslens.landscape`` from Python:
what ``--json`` prints). Callable from Python as
``landscape(["runs/wsd"], settings=LandscapeSettings(spec="rtn:2:g32", grid=11, out=Path("land.html")))``.
"""

from __future__ import annotations

import json
from typing import Annotated, List

import typer

from losslens.cli.option_groups import TRAJECTORY_HELP, LoadOptions, MemoryOptions, TrajectoryOptions, quiet_option
from losslens.cli.option_parsing import cli, flags
from losslens.lm.shared_settings import SettingsError
from losslens.study.landscape.trajectory_landscapes import LandscapeSettings

flags(
    LandscapeSettings,
    spec=typer.Option(
        "--spec",
        "-s",
        help="Quantizer spec (rtn:2:g32, gptq:4, ...): every checkpoint's quantized weights are "
        "projected onto the plane, with their distance from it.",
    ),
    grid=typer.Option("--grid", "-g", min=2, help="Grid points per axis of the loss surface."),
    out=typer.Option("--out", "-o", help="Self-contained HTML page to write."),
    k=typer.Option("--k", min=2, help="Principal axes computed (at most checkpoints − 1)."),
    axes=typer.Option("--axes", help="The two axes drawn, 0-based (0,1: PC1 and PC2)."),
    center=typer.Option(
        "--center", help="Centre of the PCA: mean, or a checkpoint's label (RUN/LABEL with several trajectories)."
    ),
    params=typer.Option("--params", help="Parameter globs spanning the space (repeatable; default all)."),
    filter_normalize=typer.Option(
        "--filter-normalize", help="Rescale the axes row by row to the centre's row norms (Li et al. 2018)."
    ),
    lawa=typer.Option("--lawa", min=2, help="Add each run's LAWA checkpoint (mean of its last K) as a point."),
    quick=typer.Option("--quick", help="Small evaluation set (4 batches of 4×64)."),
    data=typer.Option(
        "--data", help="Evaluation TokenSet file (default: the first trajectory tokenizer's default eval set)."
    ),
    calibration=typer.Option(
        "--calibration", help="Calibration TokenSet file (GPTQ/AWQ; default: the default calibration set)."
    ),
    resume=typer.Option("--resume", help=".npz file of finished grid rows (written as it goes; rerun resumes)."),
    quiet=quiet_option(),
)


def _fail(msg: str) -> None:
    """One line on stderr, exit status 2 (bad input: nothing was written)."""
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(2)


def landscape(
    trajectories: Annotated[
        List[str],
        typer.Argument(
            help="One or several trajectories drawn in one principal plane (a run and its forks). " + TRAJECTORY_HELP
        ),
    ],
    *,
    source: TrajectoryOptions = TrajectoryOptions(),
    settings: LandscapeSettings = LandscapeSettings(),
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print the explained variance ratios and every point's coordinates, residual and losses "
            "as one JSON object.",
        ),
    ] = False,
    load: LoadOptions = LoadOptions(),
    memory: MemoryOptions = MemoryOptions(),
) -> None:
    """The loss over the principal plane of whole trajectories, with the quantized points on it."""
    from losslens.geometry.base.errors import LosslensError
    from losslens.study.landscape.trajectory_landscapes import landscape_of

    try:
        land, _ = landscape_of(trajectories, settings, source=source, load=load, memory=memory)
    except SettingsError as exc:  # a bad --axes, --spec or --dtype: typer's usage error naming it
        flag, _, msg = str(exc).partition(": ")
        if flag not in ("--axes", "--spec", "--dtype"):
            raise  # --max-memory / --strict-memory: the app's one line
        raise typer.BadParameter(msg, param_hint=flag) from None
    except (LosslensError, FileNotFoundError) as exc:
        _fail(" ".join(str(exc).split()))
    if as_json:
        typer.echo(json.dumps(land.describe(), indent=2))
        return
    evr = land.pca.explained_variance_ratio
    typer.echo("explained variance: " + ", ".join(f"PC{j + 1} {100 * v:.2f}%" for j, v in enumerate(evr)))
    from losslens.study.report.landscape_section import point_rows

    for r in point_rows(land):
        typer.echo(
            f"{r['point']}: ({r['x']:.5g}, {r['y']:.5g}) {r['off plane %']:.1f}% off the plane, "
            f"own loss {r['own loss']:.6f}, on the plane {r['loss on plane']:.6f}"
        )
    typer.echo(f"wrote {settings.out}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `losslens` app."""
    app.command()(cli(landscape))
