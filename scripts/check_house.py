#!/usr/bin/env python3
"""Check the house rules of the losslens layout (ARCHITECTURE.md).

1. No module in ``geometry/``, ``probes/`` or ``benchmarks/`` is longer than 400 lines.
2. No import circles among the project's modules. Every ``import`` statement anywhere in a module
   counts -- also inside functions, methods and ``if TYPE_CHECKING:`` blocks. Importing ``a.b.c``
   also runs the ``__init__`` of ``a`` and ``a.b``, so it counts as importing those packages too
   (except the importer's own ancestors, which are always initialised before it).
3. ``geometry/`` imports neither ``probes``, ``transformers`` nor ``plotly``.
4. ``geometry/`` is split into rooms that import one way (a DAG): ``base`` imports no other room,
   ``memory`` imports base, ``operators`` imports base and memory, ``estimators`` imports base,
   memory and operators, ``surfaces`` imports base and memory. Every module lives in a room; only
   ``geometry/__init__.py`` (the public names) imports across all of them.

Usage: ``python scripts/check_house.py [ROOT]`` (default: the repository holding this script).
Prints every violation and exits 1 when there is one, 0 otherwise. The same checks are available
as :func:`check` for tests.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = {"geometry": "losslens.geometry", "probes": "losslens", "benchmarks": "benchmarks"}
"""Folder -> its import name: the distribution maps probes/ to ``losslens`` and geometry/ to
``losslens.geometry`` (pyproject.toml's package-dir)."""
MAX_LINES = 400
# folder -> top-level import names it may not import (its own package excepted)
FORBIDDEN = {"geometry": ("losslens", "transformers", "plotly")}
# folder -> room -> the other rooms it may import (rule 4)
ROOMS = {
    "geometry": {
        "base": (),
        "memory": ("base",),
        "operators": ("base", "memory"),
        "estimators": ("base", "memory", "operators"),
        "surfaces": ("base", "memory"),
    },
    "probes": {
        "lm": (),
        "measure": ("lm",),
        "study": ("lm", "measure"),
        "cli": ("lm", "measure", "study"),
    },
}
# folder -> modules at its root besides the package's __init__ (the front door)
FRONT_DOOR = {"probes": ("__main__",)}


@dataclass
class Module:
    name: str  # dotted import name; a package is named by its __init__
    path: Path
    is_package: bool
    lines: int
    folder: str = ""  # the top folder it lives in (a key of PACKAGES)
    imports: list[tuple[str, int]] = field(default_factory=list)  # (dotted target, line number)


def _as_map(packages) -> dict[str, str]:
    return dict(packages) if isinstance(packages, dict) else {p: p for p in packages}


def discover(root: Path, packages=PACKAGES) -> dict[str, Module]:
    """Every ``.py`` file under ``root/<folder>`` for each folder that exists, by dotted import name
    (``packages``: folder -> import name, or a tuple of folders named as they are imported)."""
    modules: dict[str, Module] = {}
    for folder, prefix in _as_map(packages).items():
        base = root / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            text = path.read_text(encoding="utf-8")
            mod = Module(".".join([prefix, *parts]), path, is_package, len(text.splitlines()), folder)
            mod.imports = _imports(text, mod, path)
            modules[mod.name] = mod
    return modules


def _imports(text: str, mod: Module, path: Path) -> list[tuple[str, int]]:
    """(dotted name, line) of every import statement in ``text``, relative imports resolved.
    ``from x import y`` yields ``x.y`` (resolved to ``x`` later when ``x.y`` is not a module)."""
    tree = ast.parse(text, filename=str(path))
    package = mod.name if mod.is_package else mod.name.rpartition(".")[0]
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                if node.level - 1 > len(parts) - 1:
                    raise ValueError(f"{path}:{node.lineno}: relative import beyond the top-level package")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            out.append((base, node.lineno))
            out.extend((f"{base}.{alias.name}", node.lineno) for alias in node.names if alias.name != "*")
    return out


def graph(modules: dict[str, Module]) -> dict[str, dict[str, int]]:
    """Module -> {imported project module: first line}. ``from pkg import name`` counts as importing
    ``pkg`` (and ``pkg.name`` when that is a module); every target also pulls in its ancestor
    packages that are not the importer's own ancestors."""
    edges: dict[str, dict[str, int]] = {name: {} for name in modules}
    for name, mod in modules.items():
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        for target, line in mod.imports:
            if target not in modules:
                continue  # third-party, stdlib, or ``from pkg import name`` where name is no module
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                dep = ".".join(parts[:i])
                if dep in modules and dep != name and dep not in own:
                    edges[name].setdefault(dep, line)
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def _cycle_path(comp: list[str], edges: dict[str, dict[str, int]]) -> list[str]:
    """One concrete circle inside a strongly connected component, for the message."""
    members = set(comp)
    start = comp[0]
    path, seen = [start], {start}
    while True:
        nxt = sorted(w for w in edges[path[-1]] if w in members)
        back = [w for w in nxt if w in seen]
        if back:
            return path[path.index(back[0]) :] + [back[0]]
        step = next(w for w in nxt if w not in seen)
        path.append(step)
        seen.add(step)


def check(
    root: str | Path,
    packages=PACKAGES,
    max_lines: int = MAX_LINES,
    forbidden: dict[str, tuple[str, ...]] | None = None,
    rooms: dict[str, dict[str, tuple[str, ...]]] | None = None,
) -> list[str]:
    """All violations of the four rules under ``root`` (empty list: the house is in order)."""
    root = Path(root)
    return _problems(
        root,
        discover(root, packages),
        max_lines,
        FORBIDDEN if forbidden is None else forbidden,
        ROOMS if rooms is None else rooms,
        _as_map(packages),
    )


def _package_of(target: str, packages: dict[str, str]) -> tuple[str, str] | None:
    """(folder, import prefix) of the project package a dotted name lies in (the longest prefix)."""
    best = None
    for folder, prefix in packages.items():
        if (target == prefix or target.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[1])):
            best = (folder, prefix)
    return best


def room_problems(
    root: Path,
    modules: dict[str, Module],
    rooms: dict[str, dict[str, tuple[str, ...]]],
    packages: dict[str, str] | None = None,
) -> list[str]:
    """Rule 4: every module of a roomed package lives in a room and imports only the rooms it may
    (never its package's front door). A package counts as roomed once one of its rooms exists (a
    tree without them, such as a test's miniature house, is checked by rules 1-3 alone)."""
    packages = PACKAGES if packages is None else packages
    problems: list[str] = []
    roomed = {pkg for pkg, order in rooms.items() if any((root / pkg / r).is_dir() for r in order)}
    for name, mod in sorted(modules.items()):
        folder = mod.folder
        prefix = packages.get(folder, folder)
        order = rooms.get(folder)
        rel = name[len(prefix) + 1 :].split(".") if name != prefix else []
        if folder not in roomed or not rel or rel[0] in FRONT_DOOR.get(folder, ()):
            continue  # not a roomed package, or its front door (the public names)
        room = rel[0]
        if room not in order:
            problems.append(
                f"outside the rooms: {mod.path.relative_to(root)} (put it in one of "
                f"{', '.join(f'{folder}/{r}/' for r in order)})"
            )
            continue
        for target, line in mod.imports:
            if _package_of(target, packages) != (folder, prefix):
                continue
            trel = target[len(prefix) + 1 :].split(".") if target != prefix else []
            if not trel:
                problems.append(
                    f"room order: {mod.path.relative_to(root)}:{line} imports the front door {prefix} "
                    f"(import the room that defines the name)"
                )
                continue
            if trel[0] == room or trel[0] not in order:
                continue
            if trel[0] not in order[room]:
                allowed = ", ".join(order[room]) or "no other room"
                problems.append(
                    f"room order: {mod.path.relative_to(root)}:{line} imports {prefix}.{trel[0]} "
                    f"({folder}/{room}/ may import {allowed})"
                )
    return problems


def _problems(
    root: Path,
    modules: dict[str, Module],
    max_lines: int,
    forbidden: dict[str, tuple[str, ...]],
    rooms: dict[str, dict[str, tuple[str, ...]]],
    packages: dict[str, str] | None = None,
) -> list[str]:
    packages = PACKAGES if packages is None else packages
    problems: list[str] = []
    for mod in modules.values():
        if mod.lines > max_lines:
            problems.append(f"too long: {mod.path.relative_to(root)} has {mod.lines} lines (limit {max_lines})")
    edges = graph(modules)
    for comp in cycles(edges):
        circle = _cycle_path(comp, edges)
        where = ", ".join(f"{a} -> {b} (line {edges[a][b]})" for a, b in zip(circle, circle[1:]))
        problems.append(f"import circle among {', '.join(comp)}: {where}")
    for name, mod in sorted(modules.items()):
        folder = mod.folder
        own = packages.get(folder, folder)
        for target, line in mod.imports:
            bad = target.split(".")[0]
            if bad in forbidden.get(folder, ()) and not (target == own or target.startswith(own + ".")):
                shown = ".".join(target.split(".")[:2]) if bad == own.split(".")[0] else bad
                problems.append(
                    f"forbidden import: {mod.path.relative_to(root)}:{line} imports {shown} "
                    f"({folder}/ may not import {', '.join(forbidden[folder])}, its own package aside)"
                )
    problems.extend(room_problems(root, modules, rooms, packages))
    return sorted(set(problems))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0]) if args else Path(__file__).resolve().parent.parent
    modules = discover(root)
    problems = _problems(root, modules, MAX_LINES, FORBIDDEN, ROOMS, PACKAGES)
    for p in problems:
        print(p)
    n = len(modules)
    print(
        f"check_house: {n} modules, {len(problems)} problem(s)"
        if problems
        else f"check_house: {n} modules, all rules hold"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
