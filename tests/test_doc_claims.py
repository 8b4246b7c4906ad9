"""scripts/check_doc_claims.py: every measured number and exactness claim of README.md names an
existing test or benchmark row next to it (issue #24)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_doc_claims.py"


def _checker():
    spec = importlib.util.spec_from_file_location("check_doc_claims", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["check_doc_claims"] = mod
    spec.loader.exec_module(mod)
    return mod


def _repo(tmp_path: Path, readme: str) -> Path:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "def test_fast():\n    pass\n\nclass TestK:\n    def test_m(self):\n        pass\n"
    )
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "README.md").write_text("# B\n\n## Lean LM head\n\n| shape | time |\n| a | 3 s |\n")
    (tmp_path / "README.md").write_text(readme)
    return tmp_path / "README.md"


def test_the_readme_passes():
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 problem(s)" in r.stdout


def test_claims_are_found_outside_code_and_need_a_marker(tmp_path):
    chk = _checker()
    readme = _repo(
        tmp_path,
        "\n".join(
            [
                "The demo takes 6.3 min and 24 GB.",  # 2 claims, no marker
                "",
                "- bf16 agrees within 0.1%, exactly <!-- backed: tests/test_x.py::test_fast -->",
                "- the head equals autograd to 4e-16",  # tolerance claim, unbacked
                "",
                '| a | rows equal bit for bit<!-- backed: benchmarks/README.md#lean-lm-head "3 s" --> |',
                "| b | 5× faster<!-- backed: tests/test_x.py::TestK::test_m --> |",
                "",
                "```bash",
                "losslens sweep --max-memory 40GB   # code: not a claim",
                "```",
                "Use `--max-memory 8GB` (inline code) with peak LR 3e-3 for 800 steps.",
            ]
        ),
    )
    found, problems = chk.check(readme, tmp_path)
    texts = [c.text for c in found]
    assert texts == ["6.3 min", "24 GB", "0.1%", "exactly", "to 4e-16", "bit for bit", "5×"]
    assert [c.line for c in found] == [1, 1, 3, 3, 4, 6, 7]
    assert len(problems) == 3 and all("has no backing" in p for p in problems)
    assert "README.md:1: '6.3 min'" in problems[0] and "README.md:4: 'to 4e-16'" in problems[2]


def test_named_tests_and_benchmark_rows_must_exist(tmp_path):
    chk = _checker()
    readme = _repo(
        tmp_path,
        "\n\n".join(
            [
                "A 20 s run <!-- backed: tests/test_x.py::test_gone -->",
                "A 30 s run <!-- backed: tests/test_nofile.py::test_fast -->",
                "A 40 s run <!-- backed: benchmarks/README.md#no-such-section -->",
                'A 50 s run <!-- backed: benchmarks/README.md#lean-lm-head "99 s" -->',
                "A 60 s run <!-- backed: see the code -->",
                "A 70 s run <!-- backed: tests/test_x.py::test_fast[param]; benchmarks/README.md#lean-lm-head -->",
                "A 80 s run <!-- backed: setting -->",
            ]
        ),
    )
    _found, problems = chk.check(readme, tmp_path)
    assert len(problems) == 5, problems
    assert "has no test test_gone" in problems[0]
    assert "tests/test_nofile.py does not exist" in problems[1]
    assert "no heading with anchor #no-such-section" in problems[2]
    assert "no row with '99 s'" in problems[3]
    assert "is not a reference" in problems[4]


def test_cli_exit_status_and_listing(tmp_path):
    readme = _repo(tmp_path, "Takes 6 min.\n")
    r = subprocess.run([sys.executable, str(SCRIPT), str(readme)], capture_output=True, text=True)
    assert r.returncode == 1 and "'6 min' <- NOTHING" in r.stdout and "error: README.md:1" in r.stdout


def test_a_semicolon_inside_a_quoted_row_does_not_split_the_reference():
    mod = _checker()
    found = mod.claims('Within 5% here.<!-- backed: benchmarks/README.md#x "a; b"; tests/test_x.py::test_y -->\n')
    assert found and found[0].backing == ['benchmarks/README.md#x "a; b"', "tests/test_x.py::test_y"]
