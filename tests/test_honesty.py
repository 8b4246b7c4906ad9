"""The suite and the docs say what the code does (issue #12, items 6 and 7).

- No test skips when one of the project's own modules fails to import (``pytest.importorskip`` on
  ``geometry``/``probes``/``benchmarks``): an import error in losslens must fail the suite.
- No file refers to ``SCIENCE.md``: the definitions live in ``docs/science.md``.
- Every relative link of the Markdown docs points at a file of the repository.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OWN = ("losslens", "benchmarks", "tests")
TEXT_SUFFIXES = {".py", ".md", ".toml", ".ipynb", ".sh", ".txt", ".cfg", ".yaml", ".yml"}
# Files allowed to name SCIENCE.md anyway (none: every reference points at docs/science.md).
SCIENCE_PENDING: set[str] = set()


def _repo_files():
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT)
        if (
            path.is_file()
            and path.suffix in TEXT_SUFFIXES
            and not any(
                part.startswith(".")
                or part in ("demo-out", "test-artifacts", "__pycache__")
                or part.endswith(".egg-info")
                for part in rel.parts
            )
        ):
            yield rel, path


def importorskips_of_own_modules(source: str) -> list[str]:
    """Module names passed to ``pytest.importorskip`` (or a bare ``importorskip``) that belong to losslens."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
        arg = node.args[0]
        if name == "importorskip" and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            if arg.value.split(".")[0] in OWN:
                out.append(arg.value)
    return out


def test_the_detector_finds_importorskip_of_own_modules():
    src = (
        'import pytest\nh = pytest.importorskip("losslens.geometry.operators.hessian")\n'
        'ray = pytest.importorskip("ray")\n'
    )
    assert importorskips_of_own_modules(src) == ["losslens.geometry.operators.hessian"]


def test_no_test_skips_on_an_import_error_of_losslens():
    bad = {
        str(rel): mods
        for rel, path in _repo_files()
        if rel.parts[0] == "tests" and rel.suffix == ".py"
        for mods in [importorskips_of_own_modules(path.read_text(encoding="utf-8"))]
        if mods
    }
    assert not bad, f"import the project's modules directly, never with pytest.importorskip: {bad}"


def test_no_reference_to_a_science_md_that_does_not_exist():
    assert not (ROOT / "SCIENCE.md").exists() and (ROOT / "docs" / "science.md").is_file()
    bad = [
        str(rel)
        for rel, path in _repo_files()
        if rel.as_posix() not in SCIENCE_PENDING
        and rel.name != "test_honesty.py"
        and "SCIENCE.md" in path.read_text(encoding="utf-8", errors="replace")
    ]
    assert not bad, f"these files refer to SCIENCE.md; the file is docs/science.md: {bad}"


def test_markdown_links_point_at_existing_files():
    link = re.compile(r"\]\(([^)\s]+)\)")
    broken = []
    for rel, path in _repo_files():
        if rel.suffix != ".md":
            continue
        for target in link.findall(path.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            if not (path.parent / target.split("#")[0]).exists():
                broken.append(f"{rel}: {target}")
    assert not broken, broken
