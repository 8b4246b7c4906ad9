"""The `losslens` command line: every module in :mod:`losslens.cli` registers its commands.

Failures end in one line on stderr, ``error: …``, and an exit status (README, "When things go
wrong"): 2 for anything the user can cause (a typed losslens error, a missing file, a bad option),
70 for an internal error (a bug: the line says so), 130 when interrupted; ``losslens sweep`` adds 1
(some rows failed) and 3 (all rows failed). ``--debug`` (anywhere on the command line, or
``LOSSLENS_DEBUG=1``) shows the full traceback instead.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
import warnings

import typer
from typer.core import TyperGroup

import losslens.cli as commands

# typer vendors its own click: take its exception classes from typer's public names
_UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")

EXIT_USAGE = 2
"""A failure the user can cause: bad input, a missing or damaged file, a locked store."""
EXIT_INTERNAL = 70
"""An internal error (a bug in losslens or a library it calls); rerun with --debug and report it."""
EXIT_INTERRUPTED = 130
"""Ctrl-C / SIGINT."""

_DEBUG = "losslens.debug"


def user_errors() -> tuple[type[BaseException], ...]:
    """The exception types a user can cause (printed as one line, exit 2): every
    :class:`losslens.geometry.base.errors.LosslensError` (each room's own classes derive from it), a missing
    or unreadable file (``OSError``), and running out of memory (``MemoryError``,
    ``torch.OutOfMemoryError``). Taken from the modules already loaded, so that ``losslens --help``
    stays fast: an exception whose module was never imported cannot have been raised."""
    out: list[type[BaseException]] = [OSError, MemoryError]
    errors, torch = sys.modules.get("losslens.geometry.base.errors"), sys.modules.get("torch")
    if errors is not None:
        out.append(errors.LosslensError)
    if torch is not None and hasattr(torch, "OutOfMemoryError"):
        out.append(torch.OutOfMemoryError)
    return tuple(out)


def one_line(exc: BaseException | str) -> str:
    """A message on one line (its lines joined by '; '); an exception without one gives its type."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    return "; ".join(lines) if lines else type(exc).__name__


def _debug(ctx: typer.Context) -> bool:
    return bool(ctx.meta.get(_DEBUG)) or os.environ.get("LOSSLENS_DEBUG", "").strip().lower() in (
        "1",
        "true",
        "yes",
        "on",
    )


class LosslensGroup(TyperGroup):
    """The top-level command group: accepts ``--debug`` and ``--help-all`` (``--help`` with each option's
    long help) anywhere, and turns failures into one line."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        args = list(args)
        cut = args.index("--") if "--" in args else len(args)
        if "--debug" in args[:cut]:
            ctx.meta[_DEBUG] = True
            args = [a for i, a in enumerate(args) if not (i < cut and a == "--debug")]
        if "--help-all" in args[:cut]:  # --help with every option's long help (details moved out of --help)
            from losslens.cli.option_parsing import show_details

            for command in self.commands.values():
                show_details(command)
            args = [("--help" if i < cut and a == "--help-all" else a) for i, a in enumerate(args)]
        return super().parse_args(ctx, args)

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort):
            raise
        except _UsageError as exc:
            if _debug(ctx):
                raise
            hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
            typer.echo(f"error: {one_line(exc.format_message())}{hint}", err=True)
            ctx.exit(EXIT_USAGE)
        except KeyboardInterrupt:
            if _debug(ctx):
                raise
            typer.echo(
                "error: interrupted (a sweep keeps every finished row: rerun the same command to resume)", err=True
            )
            ctx.exit(EXIT_INTERRUPTED)
        except Exception as exc:  # noqa: BLE001 - the CLI boundary
            if _debug(ctx):
                raise
            if isinstance(exc, user_errors()):
                mine = type(exc).__module__.split(".")[0] == "losslens"
                typer.echo(f"error: {one_line(exc) if mine else f'{type(exc).__name__}: {one_line(exc)}'}", err=True)
                ctx.exit(EXIT_USAGE)
            typer.echo(
                f"error: internal error {type(exc).__name__}: {one_line(exc)} -- this is a bug; rerun with "
                "--debug for the traceback and report it",
                err=True,
            )
            ctx.exit(EXIT_INTERNAL)


app = typer.Typer(
    cls=LosslensGroup,
    help="losslens: loss geometry (curvature, quantization error, loss surfaces) of LM training trajectories. "
    "`losslens COMMAND --help-all`: every option's long help.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    # plain click help: rich's boxed table gives each option ~18 columns of description at 80 columns
    rich_markup_mode=None,
    context_settings={"max_content_width": 100},
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version as _version

        typer.echo(_version("losslens"))
        raise typer.Exit()


@app.callback()
def _main(
    ctx: typer.Context,
    debug: bool = typer.Option(
        False,
        "--debug",
        help="Show the full traceback of a failure instead of one `error: …` line "
        "(also accepted after the command name; or set LOSSLENS_DEBUG=1).",
    ),
    _version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=_print_version,
        help="Print the installed losslens version and exit.",
    ),
) -> None:
    if debug:
        ctx.meta[_DEBUG] = True
    from losslens.geometry.base.errors import ProductErrorWarning

    # each command prints a flagged result's measured product error as its own one `warning:` line
    # (error_warning, --error-tolerance, --strict): the library's Python warning would say it twice
    warnings.filterwarnings("ignore", category=ProductErrorWarning)
    from losslens.geometry.base.progress import plain_warnings

    plain_warnings()  # losslens' warnings (a quantization alarm) as one `warning: …` line, no file:line


@app.command()
def version() -> None:
    """Print the installed losslens version (also `losslens --version`)."""
    _print_version(True)


for _info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
    _module = importlib.import_module(f"{commands.__name__}.{_info.name}")
    if hasattr(_module, "register"):  # a command module (sharpness_command's is registered with sweep's)
        _module.register(app)


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # python -m losslens ... = losslens ...
    main()
