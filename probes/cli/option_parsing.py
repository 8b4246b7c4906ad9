"""Option groups: a dataclass whose fields are command-line options, declared once and taken by several commands.

A command is a plain function (callable from Python and from tests) whose own options are
``Annotated[type, typer.Option(...)] = default`` parameters and whose shared options arrive as one
parameter per group, e.g. ``memory: MemoryOptions = MemoryOptions()``. :func:`cli` turns it into
the callback the CLI registers: each group parameter is replaced by the group's fields (their
names, types, flags, checks and help from the group's one declaration; their defaults from the
parameter's default instance, so a command can default a field differently), and the flat values
typer parses are put back into one group instance per parameter before the function is called::

    @dataclass(frozen=True)
    class MemoryOptions:
        max_memory: Optional[str] = option(None, "--max-memory", help="...")

    def sharpness(checkpoint: Annotated[str, typer.Argument()], *, memory: MemoryOptions = MemoryOptions()): ...

    app.command()(cli(sharpness))          # `losslens sharpness CKPT --max-memory 8GB`
    sharpness("ckpt", memory=MemoryOptions(max_memory="8GB"))   # the same from Python
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from copy import copy
from typing import Annotated, Any, Callable, Mapping

import typer

from losslens.lm.shared_settings import expand

_CLI = "losslens.cli_option"


def option(default: Any, *names: str, **settings: Any) -> Any:
    """A dataclass field that is also a command-line option: ``typer.Option(*names, **settings)``
    (``help``, ``min``, ...) with ``default``. For a CLI-only group; the library's settings objects
    (:mod:`losslens.lm.shared_settings`) get their flags from :func:`flags` instead."""
    return dataclasses.field(default=default, metadata={_CLI: typer.Option(*names, **settings)})


_FLAGS: dict[type, dict[str, Any]] = {}
"""settings class -> field name -> its ``typer.Option`` (registered by :func:`flags`)."""


def flags(group: type, **options: Any) -> type:
    """Give the library settings class ``group`` (:func:`losslens.lm.shared_settings.settings`) its command-line
    flags: one ``typer.Option`` per field (its default stays the dataclass's). Every field needs one;
    ``TypeError`` otherwise. Returns ``group``."""
    names = {f.name for f in dataclasses.fields(group)}
    if set(options) != names:
        raise TypeError(
            f"flags({group.__name__}): missing {sorted(names - set(options))}, unknown {sorted(set(options) - names)}"
        )
    _FLAGS[group] = dict(options)
    return group


def is_group(tp: Any) -> bool:
    """Whether ``tp`` is an option group: a settings class given its flags (:func:`flags`), or a
    dataclass whose every field was made by :func:`option`."""
    if not (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
        return False
    if tp in _FLAGS:
        return True
    fields = dataclasses.fields(tp)
    return bool(fields) and all(_CLI in f.metadata for f in fields)


def flag_of(group: type, name: str) -> Any:
    """The ``typer.Option`` declared for field ``name`` of ``group`` (the registered one, else the field's)."""
    if group in _FLAGS:
        if name not in _FLAGS[group]:
            raise KeyError(f"{group.__name__} has no option {name!r}")
        return _FLAGS[group][name]
    for f in dataclasses.fields(group):
        if f.name == name:
            return f.metadata[_CLI]
    raise KeyError(f"{group.__name__} has no option {name!r}")


def option_of(group: type, name: str, **changes: Any) -> Any:
    """The ``typer.Option`` of one field of ``group``, for a command that takes that option alone
    (``label: Annotated[Optional[str], option_of(CheckpointOptions, "label")] = None``); ``changes``
    replace settings of this copy (``help=...``)."""
    info = copy(flag_of(group, name))
    for key, value in changes.items():
        setattr(info, key, value)
    return info


def cli(func: Callable[..., Any], help: Mapping[str, str | None] | None = None) -> Callable[..., Any]:
    """The CLI callback of the plain command ``func``: its option-group parameters expanded into
    the groups' fields (keyword-only options, :func:`losslens.lm.shared_settings.expand`), the rest of its
    signature unchanged. ``help``: a field's help text for this command where it differs from the
    group's (``None``: no help). Raises ``TypeError`` when a field's name is also a parameter of
    ``func`` or of another group."""
    help = dict(help or {})
    sig, groups = expand(func, is_group)
    owner = {f: cls for cls, fields in groups.values() for f in fields}
    params = []
    for p in sig.parameters.values():
        if p.name in owner:
            info = copy(flag_of(owner[p.name], p.name))
            if p.name in help:
                info.help = help.pop(p.name)
            p = p.replace(annotation=Annotated[p.annotation, info])
        params.append(p)
    if help:
        raise TypeError(f"{func.__name__}: option(s) {sorted(help)} are in none of its groups")

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        for name, (cls, fields) in groups.items():
            kwargs[name] = cls(**{f: kwargs.pop(f) for f in fields})
        return func(*args, **kwargs)

    command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    if sig.return_annotation is not inspect.Signature.empty:
        command.__annotations__["return"] = sig.return_annotation
    return command


LONG_HELP: dict[str, str] = {}
"""an option's short help (what ``--help`` shows) -> its long help (what ``--help-all`` shows in its place),
registered by :func:`long_help`. Keyed by the short text, not the flag: two commands' ``--schedule``
(a trajectory's LR schedule, a fork's) keep their own long help."""


def long_help(short: str, long: str) -> str:
    """Register ``long`` as the ``--help-all`` text of the options (and arguments) whose ``--help`` text is
    ``short``; returns ``short``: ``typer.Option("--schedule", help=long_help("LR schedule.", "..."))``."""
    LONG_HELP[short] = long
    return short


def show_details(command: Any) -> None:
    """Replace the help of ``command``'s options and arguments (a click command) by their long help
    (:data:`LONG_HELP`), for ``--help-all``."""
    for param in getattr(command, "params", []):
        long = LONG_HELP.get(getattr(param, "help", None) or "")
        if long is not None:
            param.help = long


__all__ = ["LONG_HELP", "cli", "flag_of", "flags", "is_group", "long_help", "option", "option_of", "show_details"]
