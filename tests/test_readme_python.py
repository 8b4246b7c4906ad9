"""The README's Python section runs as written (issue #45): its code blocks, in order, in one namespace,
on the tests' tiny trained trajectory. The only edits are the paths (``runs/wsd`` → the tiny run, its
checkpoint ``step-000800`` → the run's last checkpoint), so an example that drifts from the API fails
here."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from tests.fixtures_trajectory import tiny_trajectory_dir

ROOT = Path(__file__).resolve().parents[1]


def _python_section_blocks() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Python API\n", 1)[1].split("\nWatching a run while it trains", 1)[0]
    return re.findall(r"```python\n(.+?)\n```", section, flags=re.S)


def test_the_python_section_has_the_front_door_examples():
    blocks = _python_section_blocks()
    assert len(blocks) == 3, blocks
    assert blocks[0].startswith("import losslens\n")
    for name in ("sharpness", "quantize", "explain", "sweep", "report", "lm_hessian", "hutchpp_trace"):
        assert f"losslens.{name}(" in "\n".join(blocks), name


@pytest.mark.slow
def test_the_readme_python_examples_run(tmp_path, monkeypatch, capsys):
    run = tiny_trajectory_dir()
    last = sorted(p for p in run.iterdir() if p.name.startswith("step-"))[-1]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"(?!losslens)")
        for block in _python_section_blocks():
            code = block.replace("runs/wsd/step-000800", str(last)).replace('"runs/wsd"', repr(str(run)))
            exec(compile(code, "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert (tmp_path / "wsd.sqlite").is_file() and (tmp_path / "wsd.html").stat().st_size > 0
    assert "TraceEstimate" in out or "trace" in out.lower()
    assert namespace["res"]["trace"]["num_matvecs"] > 0
