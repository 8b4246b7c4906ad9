"""`losslens landscape TRAJ [TRAJ ...] --spec SPEC --grid N --out PAGE.html [--json]`: the loss over
the principal plane of whole trajectories, with every checkpoint's quantized point on it
(:func:`losslens.study.landscape.trajectory_landscape.trajectory_landscape`), as an interactive page.

Several trajectories (a run and its forks, runs of a grid) go into one PCA; ``--json`` prints
:meth:`~losslens.study.landscape.trajectory_landscape.Landscape.describe` (explained variance ratios, every point's
coordinates, residuals and losses). Callable from Python as
``landscape(["runs/wsd"], spec="rtn:2:g32", grid=11, out=Path("land.html"))``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from losslens.cli.option_parsing import cli
from losslens.cli.option_groups import TRAJECTORY_HELP, LoadOptions, MemoryOptions, TrajectoryOptions


def _fail(msg: str) -> None:
    """One line on stderr, exit status 2 (bad input: nothing was written)."""
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(2)


def parse_axes(text: str, k: int) -> tuple[int, int]:
    """``"0,1"`` -> ``(0, 1)``: two different 0-based axes below ``k`` (``typer.BadParameter`` otherwise)."""
    try:
        axes = tuple(int(v) for v in text.split(","))
    except ValueError:
        axes = ()
    if len(axes) != 2 or axes[0] == axes[1] or not all(0 <= a < k for a in axes):
        raise typer.BadParameter(
            f"{text!r} is not two different axes in 0..{k - 1} (0-based: 0,1 is PC1 and PC2; "
            "raise --k to draw a later axis)",
            param_hint="--axes",
        )
    return axes  # type: ignore[return-value]


def _trajectories(names: List[str], source: TrajectoryOptions, lawa: Optional[int]) -> list:
    from losslens.lm.checkpoints import open_trajectory

    trajs = [
        open_trajectory(n, cache_dir=source.cache_dir, schedule=source.schedule, tokens_per_step=source.tokens_per_step)
        for n in names
    ]
    return [t.with_lawa(lawa) for t in trajs] if lawa else trajs


def landscape(
    trajectories: Annotated[
        List[str],
        typer.Argument(
            help="One or several trajectories drawn in one principal plane (a run and its forks). " + TRAJECTORY_HELP
        ),
    ],
    *,
    source: TrajectoryOptions = TrajectoryOptions(),
    spec: Annotated[
        Optional[str],
        typer.Option(
            "--spec",
            "-s",
            help="Quantizer spec (rtn:2:g32, gptq:4, ...): every checkpoint's quantized weights are "
            "projected onto the plane, with their distance from it.",
        ),
    ] = None,
    grid: Annotated[int, typer.Option("--grid", "-g", min=2, help="Grid points per axis of the loss surface.")] = 21,
    out: Annotated[Path, typer.Option("--out", "-o", help="Self-contained HTML page to write.")] = Path(
        "landscape.html"
    ),
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print the explained variance ratios and every point's coordinates, residual and losses "
            "as one JSON object.",
        ),
    ] = False,
    k: Annotated[int, typer.Option("--k", min=2, help="Principal axes computed (at most checkpoints − 1).")] = 2,
    axes: Annotated[str, typer.Option("--axes", help="The two axes drawn, 0-based (0,1: PC1 and PC2).")] = "0,1",
    center: Annotated[
        str,
        typer.Option(
            "--center", help="Centre of the PCA: mean, or a checkpoint's label (RUN/LABEL with several trajectories)."
        ),
    ] = "mean",
    params: Annotated[
        Optional[List[str]],
        typer.Option("--params", help="Parameter globs spanning the space (repeatable; default all)."),
    ] = None,
    filter_normalize: Annotated[
        bool,
        typer.Option(
            "--filter-normalize", help="Rescale the axes row by row to the centre's row norms (Li et al. 2018)."
        ),
    ] = False,
    lawa: Annotated[
        Optional[int],
        typer.Option("--lawa", min=2, help="Add each run's LAWA checkpoint (mean of its last K) as a point."),
    ] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Small evaluation set (4 batches of 4×64).")] = False,
    data: Annotated[
        Optional[Path],
        typer.Option(
            "--data", help="Evaluation TokenSet file (default: the first trajectory tokenizer's default eval set)."
        ),
    ] = None,
    calibration: Annotated[
        Optional[Path],
        typer.Option(
            "--calibration", help="Calibration TokenSet file (GPTQ/AWQ; default: the default calibration set)."
        ),
    ] = None,
    resume: Annotated[
        Optional[Path],
        typer.Option("--resume", help=".npz file of finished grid rows (written as it goes; rerun resumes)."),
    ] = None,
    load: LoadOptions = LoadOptions(),
    memory: MemoryOptions = MemoryOptions(),
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress lines.")] = False,
) -> None:
    """The loss over the principal plane of whole trajectories, with the quantized points on it."""
    memory.apply()
    ax = parse_axes(axes, k)
    from losslens.geometry.base.errors import LosslensError

    try:
        land, info = _compute(
            trajectories,
            source,
            spec,
            grid,
            k,
            ax,
            center,
            params,
            filter_normalize,
            lawa,
            quick,
            data,
            calibration,
            resume,
            load,
            memory,
            quiet,
        )
    except (LosslensError, FileNotFoundError) as exc:
        _fail(" ".join(str(exc).split()))
    from losslens.study.report.landscape_section import landscape_page

    names = ", ".join(trajectories)
    landscape_page(land, out, title=f"landscape of {names}", extra=info)
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
    typer.echo(f"wrote {out}")


def _compute(
    names,
    source,
    spec,
    grid,
    k,
    axes,
    center,
    params,
    filter_normalize,
    lawa,
    quick,
    data,
    calibration,
    resume,
    load,
    memory,
    quiet,
):
    """Open the inputs, check them before any weight is read, and compute the landscape."""
    from losslens.lm.core.tokenset import TokenSet
    from losslens.lm.data import default_token_sets
    from losslens.study.landscape.trajectory_landscape import trajectory_landscape
    from losslens.lm.quant import QuantizeError, QuantSpec

    try:
        needs_cal = spec is not None and QuantSpec.parse(spec).needs_calibration
    except QuantizeError as exc:
        raise typer.BadParameter(str(exc), param_hint="--spec") from None
    dtypes = ("float32", "bfloat16", "float16", "float64")
    if load.dtype is not None and load.dtype not in dtypes:
        raise typer.BadParameter(f"{load.dtype!r} is unknown; valid: {', '.join(dtypes)}", param_hint="--dtype")
    trajs = _trajectories(names, source, lawa)
    n = sum(len(t) for t in trajs)
    if n < k + 1:
        _fail(
            f"{n} checkpoint(s) in {len(trajs)} trajectory(ies) span at most {max(n - 1, 0)} principal axes, and "
            f"--k {k} needs {k + 1}: give more checkpoints or another trajectory (e.g. a fork)"
        )
    stage = (lambda s: None) if quiet else (lambda s: typer.echo(f"[landscape] {s}", err=True))
    sets = {"eval": TokenSet.load(data)} if data is not None else default_token_sets(trajs[0], quick=quick)
    if calibration is not None:
        sets["calibration"] = TokenSet.load(calibration)
    elif needs_cal and "calibration" not in sets:
        sets["calibration"] = default_token_sets(trajs[0], quick=quick)["calibration"]
    import torch

    land = trajectory_landscape(
        trajs,
        sets["eval"],
        spec=spec,
        grid=grid,
        k=k,
        axes=axes,
        center=center,
        params=params,
        filter_normalize=filter_normalize,
        calibration=sets.get("calibration") if needs_cal else None,
        dtype=None if load.dtype is None else getattr(torch, load.dtype),
        device=load.device,
        allow_pickle=load.allow_pickle,
        max_memory=memory.max_memory,
        checkpoint_path=None if resume is None else str(resume),
        progress=not quiet,
        on_stage=stage,
    )
    ev = sets["eval"]
    info = {
        "trajectories": ", ".join(str(x) for x in names),
        "checkpoints": n,
        "spec": spec or "none",
        "eval set": f"{ev.name} {tuple(ev.tokens.shape)} hash {ev.content_hash[:12]}",
        "center": center,
        "k": k,
        "filter-normalised": filter_normalize,
    }
    return land, info


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `losslens` app."""
    app.command()(cli(landscape))
