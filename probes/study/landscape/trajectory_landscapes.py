"""The loss over the principal plane of whole trajectories, from settings objects (``losslens landscape``).

:func:`landscape_of` opens the trajectories, checks the inputs before any weight is read, computes
:func:`losslens.study.landscape.trajectory_landscape.trajectory_landscape` (one PCA of all their
checkpoints, every checkpoint's quantized point projected onto the plane, the loss over it) and writes
the interactive page; :func:`landscape_description` returns
:meth:`~losslens.study.landscape.trajectory_landscape.Landscape.describe` (what ``losslens landscape
--json`` prints); :func:`landscape` is that with the CLI's options as keyword parameters
(``losslens.landscape``). Imports torch only when called.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from losslens.geometry.base.errors import LosslensError
from losslens.geometry.base.progress import Progress
from losslens.lm.shared_settings import (
    WEIGHT_DTYPES,
    LoadOptions,
    MemoryOptions,
    SettingsError,
    TrajectoryOptions,
    keywords,
    settings,
)


class LandscapeInputError(LosslensError, ValueError):
    """Trajectories that cannot span the plane asked for; the message says what to give instead."""


@settings
@dataclass(frozen=True)
class LandscapeSettings:
    """What ``losslens landscape`` computes: the quantizer spec whose points are projected (None: no
    quantized points), ``grid`` points per axis of the loss surface, the page written (``out``; None:
    none), ``k`` principal axes and the two drawn (``axes``, 0-based ``"0,1"``), the PCA's centre
    (``mean`` or a checkpoint's label, ``RUN/LABEL`` with several trajectories), the parameter globs
    spanning the space (None: all), filter normalisation, each run's LAWA checkpoint of its last
    ``lawa`` (None: none), the token sets (``data`` / ``calibration`` files, else the first trajectory's
    default sets, small with ``quick``), the ``.npz`` of finished grid rows (``resume``) and ``quiet``
    (no progress lines on stderr)."""

    spec: Optional[str] = None
    grid: int = 21
    out: Optional[Path] = Path("landscape.html")
    k: int = 2
    axes: str = "0,1"
    center: str = "mean"
    params: Optional[list[str]] = None
    filter_normalize: bool = False
    lawa: Optional[int] = None
    quick: bool = False
    data: Optional[Path] = None
    calibration: Optional[Path] = None
    resume: Optional[Path] = None
    quiet: bool = False


def parse_axes(text: str, k: int) -> tuple[int, int]:
    """``"0,1"`` -> ``(0, 1)``: two different 0-based axes below ``k``; :class:`SettingsError`
    (``"--axes: ..."``) otherwise."""
    try:
        axes = tuple(int(v) for v in text.split(","))
    except ValueError:
        axes = ()
    if len(axes) != 2 or axes[0] == axes[1] or not all(0 <= a < k for a in axes):
        raise SettingsError(
            f"--axes: {text!r} is not two different axes in 0..{k - 1} (0-based: 0,1 is PC1 and PC2; "
            "raise --k to draw a later axis)"
        )
    return axes  # type: ignore[return-value]


def landscape_of(
    trajectories: list[str],
    settings: LandscapeSettings = LandscapeSettings(),
    *,
    source: TrajectoryOptions = TrajectoryOptions(),
    load: LoadOptions = LoadOptions(),
    memory: MemoryOptions = MemoryOptions(),
):
    """``(landscape, info)``: the :class:`~losslens.study.landscape.trajectory_landscape.Landscape` of
    ``trajectories`` (trajectory names of :func:`losslens.lm.checkpoints.open_trajectory`, all in one
    PCA) and the inputs as ``{item: value}`` (shown on the page). Writes the page to ``settings.out``
    unless it is None. Applies ``memory.strict_memory`` first; progress lines ``[landscape] ...`` go to
    stderr unless ``quiet``.

    Raises :class:`SettingsError` (``"--axes: ..."``, ``"--spec: ..."``, ``"--dtype: ..."``) for a bad
    option and :class:`LandscapeInputError` for fewer than ``k + 1`` checkpoints, both before any
    weight is read; the trajectories', PCA's and evaluation's :class:`LosslensError` and
    ``FileNotFoundError`` otherwise. Cost: each checkpoint read twice a tensor slice at a time (PCA,
    projection), one quantization and one evaluation per checkpoint with a spec, and grid² evaluations
    of the eval set."""
    from losslens.lm.checkpoints import open_trajectory
    from losslens.lm.core.tokenset import TokenSet
    from losslens.lm.data import default_token_sets
    from losslens.lm.quant import QuantizeError, QuantSpec
    from losslens.study.landscape.trajectory_landscape import trajectory_landscape

    s = settings
    memory.apply()
    axes = parse_axes(s.axes, s.k)
    try:
        needs_cal = s.spec is not None and QuantSpec.parse(s.spec).needs_calibration
    except QuantizeError as exc:
        raise SettingsError(f"--spec: {exc}") from None
    if load.dtype is not None and load.dtype not in WEIGHT_DTYPES:
        raise SettingsError(f"--dtype: {load.dtype!r} is unknown; valid: {', '.join(WEIGHT_DTYPES)}")
    trajs = [
        open_trajectory(n, cache_dir=source.cache_dir, schedule=source.schedule, tokens_per_step=source.tokens_per_step)
        for n in trajectories
    ]
    if s.lawa:
        trajs = [t.with_lawa(s.lawa) for t in trajs]
    n = sum(len(t) for t in trajs)
    if n < s.k + 1:
        raise LandscapeInputError(
            f"{n} checkpoint(s) in {len(trajs)} trajectory(ies) span at most {max(n - 1, 0)} principal axes, and "
            f"--k {s.k} needs {s.k + 1}: give more checkpoints or another trajectory (e.g. a fork)"
        )
    shown = Progress(None, what="landscape", label="landscape", quiet=s.quiet, live=False)  # the stages' lines
    sets = {"eval": TokenSet.load(s.data)} if s.data is not None else default_token_sets(trajs[0], quick=s.quick)
    if s.calibration is not None:
        sets["calibration"] = TokenSet.load(s.calibration)
    elif needs_cal and "calibration" not in sets:
        sets["calibration"] = default_token_sets(trajs[0], quick=s.quick)["calibration"]
    land = trajectory_landscape(
        trajs,
        sets["eval"],
        spec=s.spec,
        grid=s.grid,
        k=s.k,
        axes=axes,
        center=s.center,
        params=s.params,
        filter_normalize=s.filter_normalize,
        calibration=sets.get("calibration") if needs_cal else None,
        dtype=load.torch_dtype(),
        device=load.device,
        allow_pickle=load.allow_pickle,
        max_memory=memory.max_memory,
        checkpoint_path=None if s.resume is None else str(s.resume),
        progress=shown,  # the grid's points under [landscape]
        on_stage=shown.echo,
    )
    ev = sets["eval"]
    info = {
        "trajectories": ", ".join(str(x) for x in trajectories),
        "checkpoints": n,
        "spec": s.spec or "none",
        "eval set": f"{ev.name} {tuple(ev.tokens.shape)} hash {ev.content_hash[:12]}",
        "center": s.center,
        "k": s.k,
        "filter-normalised": s.filter_normalize,
    }
    if s.out is not None:
        from losslens.study.report.landscape_section import landscape_page

        landscape_page(land, s.out, title=f"landscape of {', '.join(trajectories)}", extra=info)
    return land, info


def landscape_description(
    trajectories: list[str],
    settings: LandscapeSettings = LandscapeSettings(),
    *,
    source: TrajectoryOptions = TrajectoryOptions(),
    load: LoadOptions = LoadOptions(),
    memory: MemoryOptions = MemoryOptions(),
) -> dict:
    """:func:`landscape_of`'s landscape described as JSON-ready data (what ``losslens landscape --json``
    prints): the explained variance ratios, every checkpoint's and quantized point's coordinates,
    relative residual (distance from the plane / norm) and losses, and the surface. Same errors and
    cost as :func:`landscape_of` (which also writes the page to ``settings.out``)."""
    land, _ = landscape_of(trajectories, settings, source=source, load=load, memory=memory)
    return land.describe()


landscape = keywords(
    landscape_description,
    "landscape",
    """``landscape(trajectories, *, spec=None, grid=21, out="landscape.html", k=2, axes="0,1", ...)``:
    :func:`landscape_description` with :class:`LandscapeSettings`' and the shared groups' fields as keyword
    parameters (named like ``losslens landscape``'s options, with their defaults; ``out=None`` writes no
    page). ``trajectories``: a list of trajectory folders or ``hf:ORG/NAME@REVISIONS`` names drawn in one
    principal plane. Returns what ``losslens landscape --json`` prints.""",
)

__all__ = [
    "LandscapeInputError",
    "LandscapeSettings",
    "landscape",
    "landscape_description",
    "landscape_of",
    "parse_axes",
]
