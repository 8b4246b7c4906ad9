"""A sweep's results store as one self-contained HTML report, from settings objects (``losslens report``).

:func:`write_report` reads the store, analyses it (:func:`losslens.study.analysis.analyse`) and writes
the page (:func:`losslens.study.report.pages.build_report`); :func:`report` is the same with the CLI's
options as keyword parameters (``losslens.report``). Imports torch only when called.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from losslens.geometry.base.errors import LosslensError
from losslens.lm.shared_settings import keywords, settings


class ReportInputError(LosslensError, ValueError):
    """A store or surface file ``losslens report`` cannot use; the message names the file."""


@settings
@dataclass(frozen=True)
class ReportSettings:
    """What ``losslens report`` writes: the page (``out``), the surface JSON files shown with it
    (``losslens surface --json``), the title (None: from the store's name), the correlations'
    bootstrap resamples, and whether unconverged values and rows of different settings are pooled."""

    out: Path = Path("report.html")
    surfaces: Optional[list[Path]] = None
    title: Optional[str] = None
    n_boot: int = 2000
    include_unconverged: bool = False
    allow_mixed: bool = False


def write_report(store: str | Path, settings: ReportSettings = ReportSettings()) -> dict:
    """Write the report of the results store ``store``; returns ``{"path", "checkpoints", "runs", "rows"}``
    (the page written, the checkpoints and result rows it shows: what ``losslens report --json``
    prints). Raises :class:`ReportInputError` for a missing or empty store or an unreadable surface,
    and the analysis' / the page's errors (``AnalysisError``, ``StoreError``, ``ReportError``)."""
    from losslens.geometry.surfaces.surface import Surface
    from losslens.study.analysis import analyse
    from losslens.study.analysis.inputs import check_n_boot
    from losslens.study.report.pages import build_report, count_checkpoints, load_store

    s = settings
    store = Path(store)
    if not store.is_file():
        raise ReportInputError(f"no results store at {store}")
    check_n_boot(s.n_boot)
    df, plan, vers = load_store(store)
    if df is None or len(df) == 0:
        raise ReportInputError(f"{store} holds no results yet; run `losslens sweep` first")
    correlations, phases, notes = analyse(
        df, n_boot=s.n_boot, include_unconverged=s.include_unconverged, allow_mixed=s.allow_mixed
    )
    surf = {}
    for p in s.surfaces or []:
        try:
            surf[Path(p).stem] = Surface.load(p)
        except (OSError, ValueError, KeyError) as exc:
            raise ReportInputError(f"cannot read surface {p}: {exc}") from None
    path = build_report(
        df,
        s.out,
        correlations=correlations,
        phases=phases,
        surfaces=surf or None,
        plan=plan,
        versions=vers,
        title=s.title or f"losslens report: {store.name}",
        notes="; ".join(notes) if notes else None,
    )
    runs = int(df["run"].fillna("").nunique()) if "run" in df else 1
    return {"path": str(path), "checkpoints": count_checkpoints(df), "runs": runs, "rows": len(df)}


report = keywords(
    write_report,
    "report",
    """``report(store, *, out="report.html", surfaces=None, title=None, n_boot=2000, ...)``: write the
    HTML report of a sweep's results store (:func:`write_report`) with the CLI's options as keyword
    parameters; returns ``{"path", "checkpoints", "runs", "rows"}`` (what ``losslens report --json`` prints).""",
)

__all__ = ["ReportInputError", "ReportSettings", "report", "write_report"]
