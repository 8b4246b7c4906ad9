"""Issue #49 item 3: every command's ``--help`` reads at 80 columns: no line over 80, every option's
description in a column at least 30 wide (never the ~18 of rich's boxed table), and a short page (the
details in ``--help-all``, which keeps the same columns)."""

from __future__ import annotations

import re

import pytest
import typer

from losslens.cli.app import app

MAX_LINES = 60
"""``--help`` at 80 columns: sharpness, with the most shared option groups, takes 51 lines."""
MIN_DESCRIPTION = 30
"""Columns an option's description wraps into, at least."""


def _commands(group=None, path=()) -> list[tuple[str, ...]]:
    group = group or typer.main.get_command(app)
    out = []
    for name, cmd in sorted(group.commands.items()):
        out.append((*path, name))
        if hasattr(cmd, "commands"):  # a group: its subcommands too
            out += _commands(cmd, (*path, name))
    return out


COMMANDS = _commands()


def _help(args: list[str], columns: int, monkeypatch, capsys) -> str:
    """What ``losslens ARGS`` prints on a terminal of ``columns`` (typer's CliRunner forces 80 columns of text,
    two more than a terminal of 80 gets)."""
    monkeypatch.setenv("COLUMNS", str(columns))
    capsys.readouterr()
    typer.main.get_command(app).main(args, prog_name="losslens", standalone_mode=False)
    return capsys.readouterr().out


def _description_columns(text: str) -> list[tuple[int, str]]:
    """``(column, line)`` where each line of the Arguments / Options lists has its description text."""
    cols, inside = [], False
    for ln in text.splitlines():
        if ln in ("Arguments:", "Options:"):
            inside = True
            continue
        if not ln.strip() or not ln.startswith(" "):
            inside = False
            continue
        if not inside:
            continue
        term = re.match(r"  \S.*?(?:  +|$)", ln)  # "  --opt <type>   description": the description after the gap
        if term is None:  # a continuation (or a description below a long term): its indentation
            cols.append((len(ln) - len(ln.lstrip()), ln))
        elif term.end() < len(ln):
            cols.append((term.end(), ln))
    return cols


def test_every_command_is_walked():
    names = {c[0] for c in COMMANDS}
    assert {"sharpness", "sweep", "fork", "train-tiny", "landscape", "accuracy", "demo"} <= names


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_reads_at_80_columns(command, monkeypatch, capsys):
    text = _help([*command, "--help"], 80, monkeypatch, capsys)
    lines = text.splitlines()
    assert all(len(ln) <= 80 for ln in lines), [ln for ln in lines if len(ln) > 80]
    assert len(lines) <= MAX_LINES, f"{' '.join(command)} --help is {len(lines)} lines:\n{text}"
    cols = _description_columns(text)
    assert cols or command == ("version",)
    narrow = [ln for col, ln in cols if 80 - col < MIN_DESCRIPTION]
    assert not narrow, "\n".join(narrow)


@pytest.mark.parametrize("command", [("sharpness",), ("sweep",), ("fork",)], ids=" ".join)
def test_help_all_keeps_the_columns_and_says_more(command, monkeypatch, capsys):
    short = _help([*command, "--help"], 80, monkeypatch, capsys)
    full = _help([*command, "--help-all"], 80, monkeypatch, capsys)
    assert len(full.splitlines()) > len(short.splitlines())
    if command == ("sharpness",):
        assert "glibc" not in short and "glibc" in full  # --strict-memory's details
    assert all(len(ln) <= 80 for ln in full.splitlines())
    assert not [ln for col, ln in _description_columns(full) if 80 - col < MIN_DESCRIPTION]


def test_long_help_belongs_to_its_own_option(monkeypatch, capsys):
    """fork's --schedule (a fork's LR schedule) keeps its own long help, not the trajectory option's
    --schedule (an LR schedule preset for recorded checkpoints)."""
    fork = " ".join(_help(["fork", "--help-all"], 200, monkeypatch, capsys).split())
    sweep = " ".join(_help(["sweep", "--help-all"], 200, monkeypatch, capsys).split())
    assert "comma-separated for several (constant,wsd,cosine)" in fork and "pythia-160m" not in fork
    assert "pythia-160m" in sweep and "constant,wsd,cosine" not in sweep
