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
import typing
from copy import copy
from typing import Annotated, Any, Callable, Mapping

import typer

_CLI = "losslens.cli_option"


def option(default: Any, *names: str, **settings: Any) -> Any:
    """A dataclass field that is also a command-line option: ``typer.Option(*names, **settings)``
    (``help``, ``min``, ...) with ``default``. Use only inside an option group."""
    return dataclasses.field(default=default, metadata={_CLI: typer.Option(*names, **settings)})


def is_group(tp: Any) -> bool:
    """Whether ``tp`` is an option group (a dataclass whose every field was made by :func:`option`)."""
    if not (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
        return False
    fields = dataclasses.fields(tp)
    return bool(fields) and all(_CLI in f.metadata for f in fields)


def option_of(group: type, name: str, **changes: Any) -> Any:
    """The ``typer.Option`` of one field of ``group``, for a command that takes that option alone
    (``label: Annotated[Optional[str], option_of(CheckpointOptions, "label")] = None``); ``changes``
    replace settings of this copy (``help=...``)."""
    info = copy(_field(group, name).metadata[_CLI])
    for key, value in changes.items():
        setattr(info, key, value)
    return info


def _field(group: type, name: str) -> dataclasses.Field:
    for f in dataclasses.fields(group):
        if f.name == name:
            return f
    raise KeyError(f"{group.__name__} has no option {name!r}")


def cli(func: Callable[..., Any], help: Mapping[str, str | None] | None = None) -> Callable[..., Any]:
    """The CLI callback of the plain command ``func``: its option-group parameters expanded into
    the groups' fields (keyword-only options), the rest of its signature unchanged. ``help``: a
    field's help text for this command where it differs from the group's (``None``: no help).
    Raises ``TypeError`` when a field's name is also a parameter of ``func`` or of another group."""
    help = dict(help or {})
    sig = inspect.signature(func, eval_str=True)
    params: list[inspect.Parameter] = []
    groups: dict[str, tuple[type, list[str]]] = {}
    for p in sig.parameters.values():
        if not is_group(p.annotation):
            params.append(p)
            continue
        cls = p.annotation
        default = p.default if p.default is not inspect.Parameter.empty else cls()
        hints = typing.get_type_hints(cls)
        names = []
        for f in dataclasses.fields(cls):
            info = copy(f.metadata[_CLI])
            if f.name in help:
                info.help = help.pop(f.name)
            params.append(
                inspect.Parameter(
                    f.name,
                    inspect.Parameter.KEYWORD_ONLY,
                    default=getattr(default, f.name),
                    annotation=Annotated[hints[f.name], info],
                )
            )
            names.append(f.name)
        groups[p.name] = (cls, names)
    seen = [p.name for p in params]
    clash = sorted({n for n in seen if seen.count(n) > 1})
    if clash or help:
        raise TypeError(
            f"{func.__name__}: option(s) {clash or sorted(help)} "
            f"{'declared twice' if clash else 'are in none of its groups'}"
        )

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


__all__ = ["cli", "is_group", "option", "option_of"]
