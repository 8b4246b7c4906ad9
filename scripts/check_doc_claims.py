#!/usr/bin/env python3
"""Every measured number and every exactness claim in README.md names what backs it.

A *claim* is, outside code (fenced blocks and `inline code` are skipped):

- a number with a unit of time, memory, share or ratio: ``6.3 min``, ``20 s``, ``84 MB``, ``24 GB``,
  ``0.1%``, ``28–48%``, ``5×``, ``2-3 minutes``;
- a tolerance written in scientific notation after "to", "within", "at", "below", "≤" or "<":
  ``to 4e-16``, ``within 1e-6``;
- the words "exact", "exactly", "bit-identical", "bit for bit".

Each claim's *block* — its paragraph, list item or table row — must carry a marker naming what
backs it::

    <!-- backed: tests/test_lm_head.py::test_lean_head_matches_autograd -->
    <!-- backed: benchmarks/README.md#lean-lm-head -->
    <!-- backed: tests/test_a.py::test_b; benchmarks/README.md#scale "Pythia-160m" -->

A marker lists one or more references separated by ";":

- ``tests/FILE.py::TEST`` (or ``tests/FILE.py::Class::test``; a ``[param]`` suffix is allowed):
  the file must exist and define that test function at module level (or in that class);
- ``benchmarks/README.md#ANCHOR``: the file must have a heading whose GitHub anchor is ANCHOR;
  an optional ``"text"`` after it must appear in that section (a row of its table).

One marker backs every claim of its block, so keep a claim and its marker in one block and split
a block whose claims have different backing. A number that is a setting, not a measurement
("800 steps", "peak LR 3e-3") needs no marker; if the pattern catches one anyway, mark the block
``<!-- backed: setting -->``: a reader can then see it was judged to be one.

Usage: ``python scripts/check_doc_claims.py [FILE ...]`` (default: README.md of this repository).
Lists every claim with its backing, then every problem; exits 1 when there is a problem, else 0.
The same check is :func:`check` for tests.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_NUM = r"\d[\d,]*(?:\.\d+)?"
_UNIT = (
    r"(?:%|×|ms\b|s\b|sec\b|seconds?\b|min\b|minutes?\b|h\b|hours?\b|[KMGT]i?B\b|bytes\b|"
    r"pts?\b|points? of %)"
)
CLAIM_PATTERNS = (
    re.compile(rf"(?<![\w.\-/]){_NUM}(?:\s*(?:–|-|to)\s*{_NUM})?\s?{_UNIT}"),
    re.compile(r"(?:\bto|\bwithin|\bat|\bbelow|≤|<)\s*\d(?:\.\d+)?e[-−]\d+\b"),
    re.compile(r"\bexact(?:ly)?\b|\bbit-identical\b|\bbit for bit\b", re.IGNORECASE),
)
MARKER = re.compile(r"<!--\s*backed:\s*(.*?)\s*-->", re.DOTALL)
SETTING = "setting"
#: a ``;`` that separates two references (not one inside a quoted row text)
_OUTSIDE_QUOTES = re.compile(r';(?=(?:[^"]*"[^"]*")*[^"]*$)')


@dataclass
class Claim:
    line: int
    text: str
    block: str
    backing: list[str] = field(default_factory=list)


def _strip_code(text: str) -> str:
    """The text with fenced code blocks blanked (line numbers kept) and inline code spans removed."""
    out, fenced = [], False
    for ln in text.splitlines():
        if ln.lstrip().startswith("```"):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else re.sub(r"`[^`]*`", "", ln))
    return "\n".join(out)


def _blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each paragraph, list item and table row."""
    blocks: list[tuple[int, list[str]]] = []
    for i, ln in enumerate(text.splitlines(), 1):
        s = ln.strip()
        if not s:
            blocks.append((i, []))
            continue
        new = (s.startswith(("- ", "* ", "|", "#")) or re.match(r"\d+\.\s", s)) or not blocks or not blocks[-1][1]
        if blocks and blocks[-1][1] and blocks[-1][1][-1].lstrip().startswith(("|", "#")):
            new = True
        if new:
            blocks.append((i, [ln]))
        else:
            blocks[-1][1].append(ln)
    return [(i, "\n".join(lines)) for i, lines in blocks if lines]


def claims(text: str) -> list[Claim]:
    """Every claim of a Markdown text with the references its block's markers name."""
    found = []
    for first, block in _blocks(_strip_code(text)):
        refs = [r.strip() for m in MARKER.finditer(block) for r in _OUTSIDE_QUOTES.split(m.group(1)) if r.strip()]
        plain = MARKER.sub("", block)
        for pat in CLAIM_PATTERNS:
            for m in pat.finditer(plain):
                line = first + plain[: m.start()].count("\n")
                found.append(Claim(line, m.group(0).strip(), block, refs))
    return sorted(found, key=lambda c: c.line)


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def _sections(md: str) -> dict[str, str]:
    out: dict[str, str] = {}
    current = None
    for ln in md.splitlines():
        m = re.match(r"#{1,6}\s+(.*)", ln)
        if m:
            current = _slug(m.group(1))
            out.setdefault(current, "")
        elif current is not None:
            out[current] += ln + "\n"
    return out


def _test_exists(root: Path, ref: str) -> str | None:
    path, _, name = ref.partition("::")
    file = root / path
    if not file.is_file():
        return f"{path} does not exist"
    parts = [re.sub(r"\[.*\]$", "", p) for p in name.split("::")]
    if not parts or not all(parts):
        return f"{ref}: name a test, e.g. {path}::test_something"
    tree = ast.parse(file.read_text())
    scope = tree.body
    for p in parts[:-1]:
        cls = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == p]
        if not cls:
            return f"{path} has no class {p}"
        scope = cls[0].body
    if not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == parts[-1] for n in scope):
        return f"{path} has no test {'::'.join(parts)}"
    if not parts[-1].startswith("test"):
        return f"{ref}: {parts[-1]} is not a test (pytest collects test_* functions)"
    return None


def _benchmark_exists(root: Path, ref: str) -> str | None:
    m = re.fullmatch(r'([^#\s]+)#([\w\-]+)(?:\s+"(.+)")?', ref)
    if not m:
        return f'{ref}: write benchmarks/README.md#anchor ["row text"]'
    path, anchor, row = m.groups()
    file = root / path
    if not file.is_file():
        return f"{path} does not exist"
    sections = _sections(file.read_text())
    if anchor not in sections:
        return f"{path} has no heading with anchor #{anchor}"
    if row and row not in sections[anchor]:
        return f"{path}#{anchor} has no row with {row!r}"
    return None


def verify(root: Path, ref: str) -> str | None:
    """None when ``ref`` names an existing test, benchmark row or is 'setting'; else the problem."""
    if ref == SETTING:
        return None
    if ref.startswith("tests/") and "::" in ref:
        return _test_exists(root, ref)
    if ref.startswith("benchmarks/") and "#" in ref:
        return _benchmark_exists(root, ref)
    return f"{ref!r} is not a reference: use tests/FILE.py::TEST, benchmarks/README.md#ANCHOR or '{SETTING}'"


def check(path: Path, root: Path = ROOT) -> tuple[list[Claim], list[str]]:
    """(claims, problems) of one Markdown file."""
    text = path.read_text()
    found = claims(text)
    problems = []
    seen: set[str] = set()
    for c in found:
        if not c.backing:
            problems.append(
                f"{path.name}:{c.line}: {c.text!r} has no backing; add <!-- backed: tests/...::test_... --> "
                "or <!-- backed: benchmarks/README.md#... --> to its paragraph, list item or table row"
            )
        for ref in c.backing:
            if ref in seen:
                continue
            seen.add(ref)
            why = verify(root, ref)
            if why:
                problems.append(f"{path.name}:{c.line}: {why}")
    return found, problems


def main(argv: list[str]) -> int:
    files = [Path(a) for a in argv] or [ROOT / "README.md"]
    bad = 0
    for f in files:
        found, problems = check(f)
        for c in found:
            print(f"{f.name}:{c.line}: {c.text!r} <- {'; '.join(c.backing) or 'NOTHING'}")
        for p in problems:
            print(f"error: {p}")
        bad += len(problems)
    print(f"check_doc_claims: {sum(len(check(f)[0]) for f in files)} claims, {bad} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
