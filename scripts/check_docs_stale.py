#!/usr/bin/env python3
"""The prose around the code names only modules, files and imports that exist (issue #45).

Scanned: README.md, ARCHITECTURE.md, benchmarks/README.md, every ``.rst`` / ``.md`` file under docs/
(not docs/_build) and the notebooks (notebooks/*.ipynb, their JSON text: line numbers are the file's),
code blocks included. A problem is:

1. a dotted ``losslens.…`` name (prose, a code block or a role target) whose module is not in the tree.
   Names are mapped to files, not imported: ``losslens`` is ``probes/__init__.py``, ``losslens.X.Y`` is
   ``probes/X/Y.py`` or ``probes/X/Y/__init__.py``, ``losslens.geometry.X`` is ``geometry/X.py`` or
   ``geometry/X/__init__.py``. One attribute after the longest module found must be defined there
   (a top-level ``def`` / ``class`` / assignment / import, or, for a module with a lazy ``__getattr__``,
   a string of its source); what follows that attribute (a method, a field) is not checked;
2. a ``:mod:`` / ``:func:`` / ``:class:`` (and ``:meth:``, ``:attr:``, ``:exc:``, ``:data:``) target,
   in rst or MyST (``{mod}`…```), or a dotted name (``geometry.HessianOperator``), that names
   ``geometry`` or ``probes`` as if they were packages: the only import name is ``losslens``;
3. a file path ``probes/…`` or ``geometry/…`` that does not exist (a trailing ``/`` or ``*`` glob is cut;
   a module path without ``.py``, ``geometry/base/_linalg``, is the file with it);
4. ``import geometry``, ``import probes``, ``from geometry …`` or ``from probes …``, except on a line that
   says they fail (one of :data:`NEGATIONS`: "``import probes`` fails", "appear nowhere");
5. a retired sentence (:data:`RETIRED`): text that was true once and must not come back.

Usage: ``python scripts/check_docs_stale.py [--root DIR]`` (default: this repository). Prints every
problem as ``FILE:LINE: what``, then a count; exits 1 when there is a problem, else 0. Stdlib only; the
same check is :func:`check` for tests.
"""

from __future__ import annotations

import ast
import re
import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RETIRED: tuple[tuple[str, str], ...] = (
    (
        "Products run in the model's dtype",
        "half-precision checkpoints get float32 compute by default (geometry/operators/precision.py): "
        "say which dtype the products run in, as the README's 'compute' wording does",
    ),
    (
        "NamespaceClashWarning",
        "probes/_namespace.py is gone: the distribution installs only the package losslens, so there is "
        "no clash of top-level names to warn about",
    ),
)
"""(retired text, why it is wrong now): each must not appear again in the scanned files."""

_NAME = re.compile(r"(?<![\w.\-/])losslens(?:\.[A-Za-z_]\w*)+")
_ROLE = re.compile(r"(?::(?:py:)?|\{(?:py:)?)(mod|func|class|meth|attr|exc|data)[:}]`(?:[^`<]*<)?[~!.]?([\w.]+)>?`")
_PATH = re.compile(r"(?<![\w./\-])((?:probes|geometry)/[\w./*\-]*)")
_OLD_NAME = re.compile(r"(?<![\w.\-/])(?:geometry|probes)\.(?!(?:py|md|rst|html|txt)\b)[A-Za-z_]\w*(?:\.\w+)*")
NEGATIONS = ("never", "fail", "nowhere", "must not", "no longer", "refused", "not importable")
"""Words that make a line's ``import probes`` a statement that it does not work, not an instruction."""
_IMPORT = re.compile(r"\b(?:import|from)\s+(?:geometry|probes)\b(?![\w\-])")
_SOURCE_DIRS = {"geometry": "geometry"}  # losslens.geometry lives in geometry/, the rest of losslens in probes/


def scanned_files(root: Path) -> list[Path]:
    """The documentation files this check reads, in a fixed order."""
    files = [root / "README.md", root / "ARCHITECTURE.md", root / "benchmarks" / "README.md"]
    docs = root / "docs"
    if docs.is_dir():
        files += sorted(
            p for p in docs.rglob("*") if p.suffix in (".rst", ".md") and "_build" not in p.relative_to(docs).parts
        )
    files += sorted((root / "notebooks").glob("*.ipynb"))
    return [f for f in files if f.is_file()]


def module_file(root: Path, name: str) -> Path | None:
    """The source file of module ``name`` (``losslens.lm.quant`` -> probes/lm/quant/__init__.py), or None."""
    parts = name.split(".")
    if parts[0] != "losslens":
        return None
    if len(parts) > 1 and parts[1] in _SOURCE_DIRS:
        base, rest = root / _SOURCE_DIRS[parts[1]], parts[2:]
    else:
        base, rest = root / "probes", parts[1:]
    folder = base.joinpath(*rest)
    if (folder / "__init__.py").is_file():
        return folder / "__init__.py"
    if rest and folder.with_suffix(".py").is_file():
        return folder.with_suffix(".py")
    return None


@lru_cache(maxsize=None)
def _defined(path: Path) -> tuple[frozenset[str], bool, str]:
    """(top-level names the module defines or imports, whether it has a lazy ``__getattr__`` or a
    ``*`` import, its source)."""
    source = path.read_text(encoding="utf-8")
    names: set[str] = set()
    lazy = False
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            lazy |= node.name == "__getattr__"
        elif isinstance(node, ast.Assign):
            names |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                lazy |= alias.name == "*"
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.If, ast.Try)):  # `if TYPE_CHECKING:` / try-except imports
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    names |= {a.asname or a.name.split(".")[0] for a in sub.names}
                elif isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
                    names.add(sub.name)
                elif isinstance(sub, ast.Assign):
                    names |= {n.id for t in sub.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    lazy |= "__getattr__" in names  # also bound by assignment (losslens.geometry.base.lazy.lazy_exports)
    return frozenset(names), lazy, source


def name_problem(root: Path, name: str) -> str | None:
    """None when the dotted ``losslens.…`` name exists in the tree under ``root``; else what is wrong."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        path = module_file(root, ".".join(parts[:cut]))
        if path is None:
            continue
        if cut == len(parts):
            return None
        attr = parts[cut]
        names, lazy, source = _defined(path)
        if attr in names or (lazy and re.search(rf"[\"']{re.escape(attr)}[\"']", source)):
            return None
        module = ".".join(parts[:cut])
        return (
            f"{name}: module {module} ({path.relative_to(root)}) has no submodule or top-level name {attr!r}; "
            "write the name it has now"
        )
    return f"{name}: no module losslens in {root}"


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def check_text(root: Path, rel: str, text: str) -> list[str]:
    """The problems of one file's text (``rel`` is its path for the messages)."""
    problems: list[str] = []
    seen: set[tuple[int, str]] = set()

    def add(pos: int, what: str) -> None:
        key = (_line(text, pos), what)
        if key not in seen:
            seen.add(key)
            problems.append(f"{rel}:{key[0]}: {what}")

    for m in _NAME.finditer(text):
        why = name_problem(root, m.group(0))
        if why:
            add(m.start(), why)
    in_roles: set[int] = set()
    for m in _ROLE.finditer(text):
        role, target = m.groups()
        if target.split(".")[0] in ("geometry", "probes"):
            in_roles.add(m.start(2))
            add(m.start(), f":{role}:`{target}`: there is no package {target.split('.')[0]!r}; write losslens.…")
    for m in _OLD_NAME.finditer(text):
        if m.start() in in_roles:
            continue
        add(m.start(), f"{m.group(0)}: there is no package {m.group(0).split('.')[0]!r}; write losslens.…")
    for m in _PATH.finditer(text):
        path = m.group(1).split("*")[0].rstrip("/.")
        if path and not (root / path).exists() and not (root / f"{path}.py").is_file():
            add(m.start(), f"{path}: no such file or folder")
    for m in _IMPORT.finditer(text):
        line = text[text.rfind("\n", 0, m.start()) + 1 : text.find("\n", m.end()) % (len(text) + 1)].lower()
        if any(word in line for word in NEGATIONS):
            continue
        add(m.start(), f"{m.group(0)!r}: the only import name is losslens (import losslens.geometry, ...)")
    for sentence, reason in RETIRED:
        for m in re.finditer(re.escape(sentence), text):
            add(m.start(), f"retired text {sentence!r}: {reason}")
    return sorted(problems, key=lambda p: int(p.split(":")[1]))


def check(root: Path = ROOT) -> list[str]:
    """Every problem of the scanned files under ``root``."""
    problems: list[str] = []
    for f in scanned_files(root):
        problems += check_text(root, f.relative_to(root).as_posix(), f.read_text(encoding="utf-8"))
    return problems


def main(argv: list[str]) -> int:
    root = ROOT
    if argv[:1] == ["--root"] and len(argv) == 2:
        root = Path(argv[1]).resolve()
    elif argv:
        print("usage: check_docs_stale.py [--root DIR]", file=sys.stderr)
        return 2
    problems = check(root)
    for p in problems:
        print(f"error: {p}")
    print(f"check_docs_stale: {len(scanned_files(root))} files, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
