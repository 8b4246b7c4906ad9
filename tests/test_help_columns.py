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


# --------------------------------------------------------------------------- the accuracy table at 80 columns
def _on_a_terminal(args: list[str], columns: int = 80) -> str:
    """What ``losslens ARGS`` prints on stdout when stdout is a terminal (a pseudo-terminal) of ``columns``,
    escape sequences and carriage returns removed."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {**os.environ, "COLUMNS": str(columns), "LOSSLENS_PROGRESS_EVERY": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "losslens", *args],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=600) == 0, err
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode()).replace("\r", "")


def test_accuracy_table_reads_on_a_terminal_of_80_columns():
    """Issue 49: on a real terminal of 80 columns (a pipe gets 160) the accuracy table cut every cell
    (``vari…``, ``[+0.…``, ``McNe…``); now a compact table fits, with acc ± se, Δacc, its interval and
    McNemar's p whole, and says where acc_norm and the relative drop are (--json)."""
    pytest.importorskip("lm_eval")
    from tests.fixtures_trajectory import tiny_trajectory_dir

    ckpt = tiny_trajectory_dir() / "step-000060"
    text = _on_a_terminal(["accuracy", str(ckpt), "-s", "rtn:3:row", "-s", "gptq:4:g128", "--limit", "8", "-q"])
    lines = text.splitlines()
    assert all(len(ln) <= 80 for ln in lines), [ln for ln in lines if len(ln) > 80]
    assert "…" not in text, text
    rows = [ln.split() for ln in lines if ln.split()[:1] in (["fp"], ["rtn:3:row"], ["gptq:4:g128"])]
    assert len(rows) == 6, text  # FP and two specs, each on the task and the mean
    for row in rows:
        assert row[1] in ("losslens_pydoc_mc", "mean") and row[2] == "8", row
        assert re.fullmatch(r"\d\.\d{3}", row[3]) and row[4] == "±" and re.fullmatch(r"\d\.\d{3}", row[5]), row
        if row[0] != "fp":  # Δacc, the interval "[+a, +b]" and McNemar's p
            assert re.fullmatch(r"[+-]\d+\.\d\d", row[6]) and re.fullmatch(r"\[[+-]\d+\.\d,", row[7]), row
            assert re.fullmatch(r"[+-]\d+\.\d\]", row[8]) and float(row[9]) <= 1, row
    assert "acc_norm and the relative drop: --json" in " ".join(text.split())


def test_accuracy_table_wraps_long_names_instead_of_cutting_them():
    """Longer names than the terminal can hold in one line wrap inside their cell; no cell is cut."""
    import io

    from rich.console import Console

    from losslens.cli.accuracy_command import _print
    from losslens.measure.accuracy.checkpoint_accuracy import AccuracySettings

    task = "mmlu_high_school_government_and_politics"
    row = {"task": task, "n": 193, "acc": 0.25, "acc_stderr": 0.031, "acc_norm": 0.26}
    delta = {"delta_acc": -0.0123, "delta_ci_low": -0.0456, "delta_ci_high": 0.0101, "p_mcnemar": 0.0423}
    records = [{"variant": "fp", **row}, {"variant": "gguf:Q4_K_M:imatrix", **row, **delta, "rel_drop": 0.05}]
    buf = io.StringIO()
    _print(records, "runs/x/step-000800", AccuracySettings(), console=Console(file=buf, width=80, color_system=None))
    text = buf.getvalue()
    assert all(len(ln) <= 80 for ln in text.splitlines()) and "…" not in text, text
    lines = text.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("variant"))
    at, n_at = lines[header].index("task"), lines[header].index(" n ") + 1
    groups: list[list[str]] = []
    for ln in lines[header + 2 :]:  # a row starts where its n is; the lines of its folded cells follow
        if ln.startswith("acc:"):
            break
        if ln[n_at : n_at + 1].strip():
            groups.append([ln])
        elif ln.strip():
            groups[-1].append(ln)
    variants = ["".join(ln[:at].strip() for ln in g) for g in groups]
    tasks = ["".join(ln[at:].split()[0] for ln in g if ln[at:][:1].strip()) for g in groups]
    assert variants == ["fp", "gguf:Q4_K_M:imatrix"] and tasks == [task, task], text  # folded, none cut
    assert " ".join(groups[1][0][at:].split()[1:]) == "193 0.250 ± 0.031 -1.23 [-4.6, +1.0] 0.0423", text
    assert "rel. drop" not in text and "acc_norm and the relative drop: --json" in " ".join(text.split())
    wide = io.StringIO()
    _print(records, "runs/x/step-000800", AccuracySettings(), console=Console(file=wide, width=160, color_system=None))
    assert "rel. drop" in wide.getvalue() and "McNemar p" in wide.getvalue()  # where it fits: the full table
