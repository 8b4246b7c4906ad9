"""The formatter and the linter (ruff; one line length, 120, in pyproject.toml [tool.ruff]): the whole
tree is formatted (``ruff format --check``) and lint-clean (``ruff check``), as ``make check`` runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("ruff")  # a dev dependency: `make test` installs it


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)


def test_the_tree_is_formatted():
    out = _ruff("format", "--check", ".")
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_tree_is_lint_clean():
    out = _ruff("check", ".")
    assert out.returncode == 0, out.stdout + out.stderr
