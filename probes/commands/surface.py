"""`losslens surface` (the quantization plane of a checkpoint as an interactive page) and
`losslens report` (a sweep's results store as a self-contained HTML report)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer


def _echo_err(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)


def _previous_of(checkpoint: Path):
    """The checkpoint before ``checkpoint`` in the trajectory of its parent folder (or None)."""
    from probes.checkpoints import Trajectory

    try:
        traj = Trajectory.from_folder(checkpoint.parent)
    except Exception:
        return None
    real = [r for r in traj if not r.derived]
    for i, ref in enumerate(real):
        loc = Path(ref.location).resolve() if ref.location else None
        if loc == checkpoint.resolve() and i > 0:
            return real[i - 1]
    return None


def quantization_surface(checkpoint: Path, previous: Path | None, spec: str, grid: int = 31, margin: float = 0.25,
                         quick: bool = False, device: str | None = None, resume: Path | None = None,
                         progress: bool = True, seed: int = 0, random_plane: bool = False,
                         data: Path | None = None, calibration: Path | None = None):
    """Build the plane A = checkpoint, B = previous, C = quantize(A, spec) (or Li et al.'s random
    plane around A) and evaluate the eval token set on a ``grid``×``grid`` grid.

    Returns ``(surface, info)`` where ``info`` describes the inputs. Cost: one quantization of A
    plus (grid² + 3) × n_eval_batches forwards. ``data``/``calibration``: TokenSet files to use
    instead of :func:`probes.data.default_token_sets` (which needs the checkpoint's tokenizer).
    """
    import torch

    from geometry.grid import GridSpec
    from geometry.planes import random_plane as make_random_plane
    from geometry.surface import evaluate_surface
    from probes.checkpoints import CheckpointLoader, CheckpointRef
    from probes.data import default_token_sets
    from probes.lm import lm_loss
    from probes.tokenset import TokenSet

    gs = GridSpec(resolution=grid, margin=margin)  # bad grids fail before any loading
    ref_a = CheckpointRef.from_path(checkpoint)
    loader = CheckpointLoader(ref_a, device=device)
    sets = {"eval": TokenSet.load(data)} if data is not None else default_token_sets(ref_a, quick=quick)
    if calibration is not None:
        sets["calibration"] = TokenSet.load(calibration)
    info = {"A (checkpoint)": str(checkpoint), "eval set": f"{sets['eval'].name} {tuple(sets['eval'].tokens.shape)} "
                                                             f"hash {sets['eval'].content_hash[:12]}"}
    if random_plane:
        model = loader.load(ref_a)
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        plane = make_random_plane(params, seed=seed, label="A")
        info["plane"] = f"random, filter-normalised (Li et al. 2018), seed {seed}"
    else:
        if previous is None:
            prev_ref = _previous_of(checkpoint)
            if prev_ref is None:
                raise typer.BadParameter("no --previous given and no earlier checkpoint found beside CHECKPOINT")
        else:
            prev_ref = CheckpointRef.from_path(previous)
        from probes.checkpoints import ArchitectureMismatchError
        from probes.qplane import quantization_plane

        try:
            plane, model = quantization_plane(loader, ref_a, prev_ref, spec, sets.get("calibration"))
        except ArchitectureMismatchError as exc:
            raise typer.BadParameter(f"--previous does not match CHECKPOINT: {exc}") from exc
        info.update({"B (previous)": str(prev_ref.location or prev_ref.label), "C": f"A quantized with {spec}"})
    with torch.no_grad():
        surf = evaluate_surface(model, lm_loss, sets["eval"], plane, gs, progress=progress,
                                checkpoint_path=str(resume) if resume else None, merge_batches=True)
    return surf, info


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors caused by the inputs (printed as one line, exit code 2) rather than bugs."""
    from geometry.grid import GridError
    from geometry.planes import PlaneError
    from geometry.surface import SurfaceError

    errs: list[type[BaseException]] = [PlaneError, GridError, SurfaceError, FileNotFoundError]
    for mod, name in (("probes.checkpoints", "CheckpointError"), ("probes.quant", "QuantizeError"),
                      ("probes.tokenset", "TokenSetError"), ("probes.lm", "LossError")):
        try:
            errs.append(getattr(__import__(mod, fromlist=[name]), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errs)


def register(app: typer.Typer) -> None:
    @app.command()
    def surface(
        checkpoint: Path = typer.Argument(..., help="Checkpoint folder (or weight file) Θ_K: the plane's origin A."),
        previous: Optional[Path] = typer.Option(None, "--previous", "-p",
                                                help="Previous checkpoint Θ_{K−1} (B). Default: the one before CHECKPOINT in its folder."),
        spec: str = typer.Option("rtn:4:g128", "--spec", "-s", help="Quantizer spec giving C = Θ̂_K (e.g. rtn:4:g128, int8, gptq:3:g128)."),
        grid: int = typer.Option(31, "--grid", "-g", help="Grid points per axis (>= 2)."),
        margin: float = typer.Option(0.25, "--margin", help="Margin around A, B, C as a fraction of their extent."),
        out: Path = typer.Option(Path("surface.html"), "--out", "-o", help="Self-contained HTML page to write."),
        json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the Surface as JSON (input of `losslens report --surface`)."),
        png: Optional[Path] = typer.Option(None, "--png", help="Also write a static PNG (needs kaleido + Chromium; skipped otherwise)."),
        log: bool = typer.Option(False, "--log", help="Colour/height by log10(loss)."),
        quick: bool = typer.Option(False, "--quick", help="Small evaluation set (4 batches of 4×64)."),
        data: Optional[Path] = typer.Option(None, "--data", help="Evaluation TokenSet file (default: the checkpoint tokenizer's default eval set)."),
        calibration: Optional[Path] = typer.Option(None, "--calibration", help="Calibration TokenSet file (GPTQ)."),
        random: bool = typer.Option(False, "--random-plane", help="Li et al. random filter-normalised plane around CHECKPOINT instead."),
        seed: int = typer.Option(0, "--seed", help="Seed of the random plane."),
        resume: Optional[Path] = typer.Option(None, "--resume", help=".npz file of finished grid rows (written as it goes; rerun resumes)."),
        device: Optional[str] = typer.Option(None, "--device", help="Device (default cpu; e.g. cuda)."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    ) -> None:
        """Draw the quantization plane through a checkpoint, its predecessor and its quantized self."""
        from probes.report import export_png, surface_page
        from probes.surface_figures import surface_figure

        try:
            surf, info = quantization_surface(checkpoint, previous, spec, grid=grid, margin=margin, quick=quick,
                                              device=device, resume=resume, progress=not quiet, seed=seed,
                                              random_plane=random, data=data, calibration=calibration)
        except _user_errors() as exc:
            _echo_err(f"{type(exc).__name__}: {exc}")
            raise typer.Exit(2)
        title = f"loss on the {'random' if random else 'quantization'} plane of {checkpoint.name}"
        surface_page(surf, out, title=title, log=log, extra=info)
        if json_out:
            surf.save(json_out)
        for label, (x, y, loss) in surf.points.items():
            typer.echo(f"{label}: (x={x:.5g}, y={y:.5g}) loss {loss:.6f}")
        typer.echo(f"{len(surf.x)}×{len(surf.y)} grid in {surf.seconds:.1f} s "
                   f"({surf.meta['points_per_second']:.2f} points/s); {surf.n_nonfinite} non-finite point(s)")
        if png:
            ok = export_png(surface_figure(surf, log=log, title=title), png, width=1300, height=560)
            typer.echo(f"PNG {'written to ' + str(png) if ok else 'skipped (kaleido/Chromium unavailable)'}")
        typer.echo(f"wrote {out}")

    @app.command()
    def report(
        store: Path = typer.Argument(..., help="Results store of a sweep (SQLite, from `losslens sweep`)."),
        out: Path = typer.Option(Path("report.html"), "--out", "-o", help="Self-contained HTML report to write."),
        surfaces: Optional[List[Path]] = typer.Option(None, "--surface", help="Surface JSON(s) from `losslens surface --json` to include."),
        title: Optional[str] = typer.Option(None, "--title", help="Report title."),
        n_boot: int = typer.Option(2000, "--n-boot", help="Bootstrap resamples for the correlation intervals."),
    ) -> None:
        """Turn a sweep's results store into one self-contained HTML report (works offline)."""
        from geometry.surface import Surface
        from probes.report import ReportError, build_report

        if not store.exists():
            _echo_err(f"no results store at {store}")
            raise typer.Exit(2)
        df, plan, vers = load_store(store)
        if df is None or len(df) == 0:
            _echo_err(f"{store} holds no results yet; run `losslens sweep` first")
            raise typer.Exit(2)
        correlations, phases, notes = analyse(df, n_boot=n_boot)
        surf = {}
        for p in surfaces or []:
            try:
                surf[p.stem] = Surface.load(p)
            except (OSError, ValueError, KeyError) as exc:
                _echo_err(f"cannot read surface {p}: {exc}")
                raise typer.Exit(2)
        try:
            path = build_report(df, out, correlations=correlations, phases=phases, surfaces=surf or None, plan=plan,
                                versions=vers, title=title or f"losslens report: {store.name}",
                                notes="; ".join(notes) if notes else None)
        except ReportError as exc:
            _echo_err(str(exc))
            raise typer.Exit(2)
        typer.echo(f"wrote {path} ({df['checkpoint'].nunique()} checkpoints, {len(df)} result rows)")


def load_store(path: Path):
    """(results DataFrame, plan or None, versions dict) of a sweep store (probes.sweep)."""
    from probes.report import versions as current_versions

    try:
        from probes.sweep import Store
    except ImportError:  # pragma: no cover - package __init__ not written yet
        from probes.sweep.store import Store
    with Store(path) as st:
        df = st.results()
        try:
            plan = st.plan
        except Exception:
            plan = st.meta.get("plan_json")
        stored = st.meta.get("versions") or {}
    vers = {f"{k} (sweep)": v for k, v in (stored.items() if isinstance(stored, dict) else [])}
    vers.update({f"{k} (report)": v for k, v in current_versions().items()})
    return df, plan, vers


def analyse(df, n_boot: int = 2000):
    """Correlation table and per-run phases from probes.analysis (whatever can be computed).

    Returns ``(correlations DataFrame | None, {run: Phases} | None, notes)``."""
    notes: list[str] = []
    try:
        from probes import analysis
    except ImportError:  # pragma: no cover
        return None, None, ["probes.analysis unavailable: no correlations or phases"]
    correlations = None
    runs = list(dict.fromkeys(df["run"].fillna("run"))) if "run" in df else ["run"]
    try:
        base = df[df["run"].fillna("run") == runs[0]] if len(runs) > 1 else df
        correlations = analysis.summary(base, n_boot=n_boot)
        if len(runs) > 1:
            notes.append(f"correlations computed on run {runs[0]!r}")
    except Exception as exc:
        notes.append(f"correlations unavailable: {exc}")
    phases = {}
    qspecs = [s for s in dict.fromkeys(df.loc[df["probe"] == "quant", "spec"]) if isinstance(s, str)]
    for run in runs:
        sub = df[df["run"].fillna("run") == run] if "run" in df else df
        try:
            phases[run if len(runs) > 1 else ""] = analysis.detect_phases(sub, gap=qspecs[0] if qspecs else "rtn:4")
        except Exception as exc:
            notes.append(f"phases of {run!r} unavailable: {exc}")
    return correlations, (phases or None), notes
