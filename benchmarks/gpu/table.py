"""The GPU check's rows as a plain-text table that fits a terminal, a pipe or a log.

Each section's name on a line of its own, then its rows in five columns: ``what``, ``on`` (shape,
dtype, tokens), ``result`` (a check's relative difference against its tolerance, or the row's key
measurement), ``time`` and ``status``. A long
cell wraps inside its column (at most :data:`MAX_CELL_LINES` lines, the last ending in ``…``); an
error, a skip's reason and install line, or the device's name go on a full-width note line under
their row. Every other field stays in the JSON (``--json``) and the markdown table (``--markdown``).
Plain text only (spaces and ``-``), so the table reads the same in a pipe as on a terminal. Where
even the narrowest columns (:data:`MIN_WIDTHS`) do not fit, each row is printed as a short block.
"""

from __future__ import annotations

import os
import sys
import textwrap

COLUMNS = ("what", "on", "result", "time", "status")
#: the narrowest each column gets (cells wrap inside it); a section's name heads its rows
MIN_WIDTHS = {"what": 20, "on": 9, "result": 12, "time": 6, "status": 8}
#: (column, floor): the order in which the flexible columns give up width to fit the terminal
SHRINK = (("what", 40), ("result", 16), ("on", 12), ("what", 24), ("result", 12), ("on", 9), ("what", 20))
GAP, INDENT = "  ", "  "
MAX_CELL_LINES = 4
MAX_NOTE_LINES = 6
_DTYPES = {"float32": "fp32", "float64": "fp64", "bfloat16": "bf16", "float16": "fp16"}
LEGEND = (
    "result: a check's relative difference against its tolerance; throughput: gradients per HVP "
    "(time: one gradient); memory: peak above the start ÷ plan; quant time: on the device. "
    "Every field of every row: --json (and --markdown)."
)


def terminal_width(stream=None) -> int:
    """Columns to render for: ``COLUMNS`` when set, else the terminal's width when ``stream``
    (default stdout) is a terminal, else 80 (a pipe, a file, a log)."""
    env = os.environ.get("COLUMNS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    stream = sys.stdout if stream is None else stream
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        pass
    return 80


def num(v: float) -> str:
    """A float in at most three significant digits, exponent without padding (3.1e-13, 1e-9)."""
    if v != v:
        return "nan"
    s = f"{v:.3g}"
    return s.replace("e-0", "e-").replace("e+0", "e+")


def seconds(s: float) -> str:
    """Seconds as a short duration: 250µs, 12ms, 1.2s, 123s."""
    if s < 1e-3:
        return f"{s * 1e6:.0f}µs"
    if s < 1:
        return f"{s * 1e3:.0f}ms"
    return f"{s:.1f}s" if s < 100 else f"{s:.0f}s"


def _on(row: dict) -> str:
    parts = [str(row[k]) for k in ("shape",) if k in row]
    if "dtype" in row:
        parts.append(_DTYPES.get(str(row["dtype"]), str(row["dtype"])))
    if "tokens" in row:
        parts.append(str(row["tokens"]))
    if "seq" in row:
        parts.append(f"seq {row['seq']}")
    if "fused" in row:
        parts.append("fused SDPA" if row["fused"] else "unfused")
    return " ".join(parts)


def _result(row: dict) -> str:
    status = row.get("status")
    if "tolerance" in row and "value" in row:
        v, tol = float(row["value"]), float(row["tolerance"])
        return f"{num(v)} {'≤' if status == 'ok' else '>'} {num(tol)}"
    if status == "failed" and "error" in row:
        return str(row["error"]).split(":", 1)[0]
    if "reverse_grads" in row:
        py = num(row["pyhessian_grads"]) if "pyhessian_grads" in row else "–"
        return f"{num(row['reverse_grads'])} rev, {num(row['difference_grads'])} diff, {py} PyHessian"
    if "allocated_over_plan" in row:
        out = f"{num(row['allocated_over_plan'])}× alloc"
        if "reserved_over_plan" in row:
            out += f", {num(row['reserved_over_plan'])}× reserved"
        return out
    if "checkpoints" in row:
        return f"{row['checkpoints']} checkpoints, {row.get('rows', '?')} rows, {row.get('failed', 0)} failed"
    if "kernels" in row:
        k = str(row["kernels"])
        return k if k == "none seen" else f"{len(k.split(', '))} kernels seen"
    if row.get("what") == "device" and "torch" in row:
        return f"torch {row['torch']}"
    return ""


def _time(row: dict) -> str:
    for key in ("s_per_gradient", "device_s", "seconds"):
        if isinstance(row.get(key), (int, float)):
            return seconds(float(row[key]))
    return ""


def _note(row: dict) -> str:
    """What a row must say in full, under it: an error, a skip's reason and install line, the device."""
    parts = []
    if row.get("status") == "failed" and "error" in row:
        parts.append(str(row["error"]))
    if "reason" in row:
        parts.append(str(row["reason"]))
    if "install" in row:  # a line of its own, to copy
        parts.append(f"install: {row['install']}")
    if "kernels" in row and row["kernels"] != "none seen":
        parts.append(f"kernels: {row['kernels']}")
    py = row.get("pyhessian")
    if isinstance(py, str):
        parts.insert(0, f"PyHessian {py}")
    if row.get("what") == "device" and "device" in row:
        budget = f", budget {row['budget_s']:.0f} s" if isinstance(row.get("budget_s"), (int, float)) else ""
        parts.append(f"{row['device']}{budget}{', quick' if row.get('quick') else ''}")
    return "\n".join(parts)


def cells(row: dict) -> dict[str, str]:
    """The five column cells of one row (unwrapped), ``section``, and ``note``: lines to print in
    full under the row (may be empty)."""
    return {
        "section": str(row.get("section", "")),
        "what": str(row.get("what", "")),
        "on": _on(row),
        "result": _result(row),
        "time": _time(row),
        "status": str(row.get("status", "")),
        "note": _note(row),
    }


def wrap(text: str, width: int, max_lines: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters, at most ``max_lines`` (the last ending in …)."""
    if not text:
        return [""]
    lines = textwrap.wrap(text, width, break_on_hyphens=False) or [""]
    if len(lines) > max_lines:
        last = lines[max_lines - 1]
        lines = lines[: max_lines - 1] + [last[: width - 1].rstrip() + "…"]
    return lines


def _widths(table: list[dict[str, str]], width: int) -> dict[str, int]:
    """Each column's width: its widest cell, then ``what``, ``result`` and ``on`` narrowed (in
    :data:`SHRINK`'s order, each to its floor) until a row fits ``width``."""
    w = {c: max([len(c)] + [len(t[c]) for t in table]) for c in COLUMNS}
    w["time"], w["status"] = max(w["time"], MIN_WIDTHS["time"]), max(w["status"], MIN_WIDTHS["status"])
    budget = width - len(INDENT) - len(GAP) * (len(COLUMNS) - 1)
    for col, floor in SHRINK:
        cut = min(sum(w.values()) - budget, w[col] - floor)
        if cut > 0:
            w[col] -= cut
    return w


def terminal_table(rows: list[dict], width: int | None = None) -> str:
    """``rows`` as plain text of at most ``width`` columns (default: :func:`terminal_width`): one
    header line per section, then its rows (what, on, result, time, status) and their notes."""
    width = max(24, terminal_width() if width is None else width)  # narrower: wrapping has no room left
    table = [cells(r) for r in rows]
    w = _widths(table, width)
    if sum(w.values()) + len(INDENT) + len(GAP) * (len(COLUMNS) - 1) > width:
        return _blocks(table, width)
    out = [
        INDENT + GAP.join(c.ljust(w[c]) for c in COLUMNS).rstrip(),
        INDENT + GAP.join("-" * w[c] for c in COLUMNS),
    ]
    section = None
    for t in table:
        if t["section"] != section:
            section = t["section"]
            out.append(section)
        parts = {c: wrap(t[c], w[c], MAX_CELL_LINES) for c in COLUMNS}
        for i in range(max(len(p) for p in parts.values())):
            line = GAP.join((parts[c][i] if i < len(parts[c]) else "").ljust(w[c]) for c in COLUMNS)
            out.append((INDENT + line).rstrip())
        for part in t["note"].splitlines():  # each part of the note starts with ↳
            note = wrap(part, width - 2 * len(INDENT) - 2, MAX_NOTE_LINES)
            out += [f"{INDENT * 2}{'↳ ' if i == 0 else '  '}{line}" for i, line in enumerate(note)]
    out += ["", *textwrap.wrap(LEGEND, width)]
    return "\n".join(out)


def _blocks(table: list[dict[str, str]], width: int) -> str:
    """Too narrow for columns: one block per row (``section  status  what``, then indented fields)."""
    out = []
    for t in table:
        out += wrap(f"{t['section']}  {t['status']}  {t['what']}", width, MAX_CELL_LINES)
        for c in ("on", "result", "time"):
            if t[c]:
                out += [INDENT + line for line in wrap(f"{c}: {t[c]}", width - len(INDENT), MAX_NOTE_LINES)]
        for part in t["note"].splitlines():
            out += [INDENT + line for line in wrap(part, width - len(INDENT), MAX_NOTE_LINES)]
    return "\n".join(out)
