"""Strict sizes (issue #36): one parser for every size a user writes (--max-memory, a plan's
max_memory), losslens.geometry.memory.budget.parse_size behind its parse_bytes. A bad size is one line,
exit 2, saying what was read and what is accepted; a good one parses to its exact bytes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from losslens.geometry.memory.budget import MemoryBudgetError, _room, parse_bytes
from losslens.geometry.memory.budget import MIN_SIZE, SizeError, parse_size
from losslens.cli.app import app

RAM = _room("cpu")[0]
OVER_RAM = f"{RAM // 10**6 + 1000}MB"  # more than this machine has

GOOD = [  # (written, bytes): decimal units are powers of 1000, binary ones powers of 1024
    ("8GB", 8 * 10**9),
    ("8 GB", 8 * 10**9),
    (" 8GB ", 8 * 10**9),
    ("8gb", 8 * 10**9),
    ("8Gb", 8 * 10**9),
    ("512MiB", 512 * 2**20),
    ("512mib", 512 * 2**20),
    ("1MB", MIN_SIZE),
    ("1000kB", MIN_SIZE),
    ("1000000B", MIN_SIZE),
    ("0.5GB", 500_000_000),
    ("0.5GiB", 536_870_912),
    ("1.5GiB", 1_610_612_736),
    (".5GB", 500_000_000),
    ("4.35MB", 4_350_000),  # exact: 4.35 * 1e6 in floats is 4349999.999…
    ("1.0000005MB", 1_000_000),  # rounded down to a whole byte
    ("1TB", 10**12),
    ("1TiB", 2**40),
]

BAD = [  # (written, words the line must hold besides what was read)
    ("1e99TB", "exponent"),
    ("1e400", "exponent"),
    ("2e9B", "exponent"),
    ("0.5", "no unit"),
    ("0", "no unit"),
    ("1073741824", "no unit"),
    ("-1GB", "no sign"),
    ("+5GB", "no sign"),
    ("0GB", "below the smallest size"),
    ("20kB", "below the smallest size"),
    ("0.0001GB", "below the smallest size"),
    ("512KiB", "below the smallest size"),
    ("nan", "not a finite number"),
    ("NaNGB", "not a finite number"),
    ("inf", "not a finite number"),
    ("infTB", "not a finite number"),
    ("lots", "not a number followed by a unit"),
    ("eight GB", "not a number followed by a unit"),
    ("1,000MB", "not a number followed by a unit"),
    ("1.5.3GB", "not a number followed by a unit"),
    ("8 G B", "not a number followed by a unit"),
    ("GB", "not a number followed by a unit"),
    ("8G", "ambiguous"),
    ("512m", "ambiguous"),
    ("5 parsecs", "unknown unit"),
    ("8GBs", "unknown unit"),
    ("8 bits", "unknown unit"),
    ("", "empty"),
    ("   ", "empty"),
    ("9" * 80 + "TB", "82 characters"),
    ("99999999999999999999TB", "more than this machine's RAM"),
    (OVER_RAM, "more than this machine's RAM"),
]


@pytest.mark.parametrize("written, nbytes", GOOD)
def test_a_good_size_parses_to_its_exact_bytes(written, nbytes):
    assert parse_size(written, limit=2**41) == nbytes
    if nbytes <= RAM:  # through the machine's cap too
        assert parse_bytes(written) == nbytes
    else:
        with pytest.raises(MemoryBudgetError, match="more than this machine's RAM"):
            parse_bytes(written)


def test_units_decimal_and_binary():
    assert parse_size("1GB") == 10**9 and parse_size("1GiB") == 2**30
    assert parse_size("1000kB") == parse_size("1MB") == MIN_SIZE
    assert parse_size("1024KiB") == parse_size("1MiB") == 2**20
    with pytest.raises(SizeError, match="below the smallest size"):
        parse_size("999999B")


def _cli_line(*args) -> tuple[int, list[str]]:
    r = CliRunner().invoke(app, [str(a) for a in args])
    return r.exit_code, [ln for ln in r.output.splitlines() if ln.strip()]


@pytest.mark.parametrize("written, words", BAD)
def test_a_bad_size_is_one_line_and_exit_2_through_the_cli(written, words):
    code, lines = _cli_line("sharpness", "no-such-checkpoint", "--max-memory", written)
    assert code == 2, lines
    (line,) = lines
    assert line.startswith("error: ") and "--max-memory" in line and words in line, line
    shown = repr(written.strip())[:21].rstrip("'") if written.strip() else "empty"
    assert shown in line, line  # what was read
    assert "(powers of 1024)" in line or "1MB to" in line  # what is accepted
    assert "Traceback" not in line and "internal error" not in line


def test_the_table_is_at_least_fifteen_kinds_of_bad():
    assert len(BAD) >= 15 and len({w for _, w in BAD}) >= 9


def test_numbers_from_code_are_exact_bytes_and_other_types_are_refused():
    assert parse_bytes(1000) == 1000 and parse_bytes(10**15) == 10**15  # code's budgets: no 1 MB floor, no cap
    for bad, words in (
        (0, "at least 1"),
        (-5, "at least 1"),
        (True, "the bool True"),
        (0.5, "the float 0.5"),
        (8e9, "the float"),
        (float("nan"), "the float nan"),
        (float("inf"), "the float inf"),
        (None, "NoneType"),
        ([8], "the list"),
    ):
        with pytest.raises(MemoryBudgetError, match=words):
            parse_bytes(bad)


def test_the_cap_is_the_gpu_memory_on_a_cuda_device(monkeypatch):
    gpu = 8 * 10**9
    if not torch.cuda.is_available():  # without CUDA, a "cuda" device is checked against the RAM
        assert parse_bytes(f"{RAM}B", "cuda:0") == RAM
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=gpu))
    assert parse_bytes("7GB", "cuda:0") == 7 * 10**9
    with pytest.raises(
        MemoryBudgetError,
        match=r"'9GB' is 9,000,000,000 bytes, more than the memory of cuda:0 "
        r"\(8,000,000,000 bytes\); write a size from 1MB to 8000MB",
    ):
        parse_bytes("9GB", "cuda:0")
    # device unknown (an option checked before the model is placed): the larger of the RAM and each GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=4 * RAM))
    assert parse_bytes(f"{2 * RAM}B") == 2 * RAM
    with pytest.raises(MemoryBudgetError, match="more than the memory of cuda:"):
        parse_bytes(f"{5 * RAM}B")


def test_an_estimator_refuses_a_bad_size_before_any_product():
    from losslens.geometry.estimators.trace import hutchinson_trace
    from losslens.geometry.operators.dense import DenseOperator

    op = DenseOperator(torch.eye(4, dtype=torch.float64))
    for bad in ("0.5", "1e99TB", OVER_RAM):
        with pytest.raises(MemoryBudgetError):
            hutchinson_trace(op, num_matvecs=4, max_memory=bad)
    assert op.num_matvecs == 0
    assert hutchinson_trace(op, num_matvecs=4, max_memory="1MB").value == pytest.approx(4.0)


@pytest.mark.parametrize(
    "value, ok",
    [
        ('"2GB"', True),
        ("2000000000", True),
        ('"1e99TB"', False),
        ('"0.5"', False),
        ("0.5", False),
        ("8e9", False),
        ('"8G"', False),
    ],
)
def test_a_plan_file_size_is_read_by_the_same_parser(tmp_path, value, ok):
    from losslens.study.sweep import Plan, PlanError

    path = tmp_path / "plan.toml"
    path.write_text(f'name = "p"\nmax_memory = {value}\n[probes]\nloss = true\n')
    if ok:
        assert parse_bytes(Plan.from_file(path).max_memory) == 2 * 10**9
    else:
        with pytest.raises(PlanError, match="max_memory: "):
            Plan.from_file(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from losslens.study.sweep.testing import tiny_trajectory

    return tiny_trajectory(tmp_path_factory.mktemp("sizes") / "tiny", n=2, seed=3)


@pytest.mark.parametrize("written, shown", [("1MiB", "1.05 MB"), ("1.5MB", "1.50 MB")])
def test_an_accepted_size_reaches_the_plan_as_its_bytes(tiny, written, shown):
    """Through the CLI: the tiny model's plan needs ~1.8 MB, so the budget is refused by the plan, which
    prints the bytes the parser gave it."""
    code, lines = _cli_line(
        "sharpness",
        tiny,
        "--max-memory",
        written,
        "--num-matvecs",
        "3",
        "--threads",
        "1",
        "--data",
        tiny / "data" / "curvature.safetensors",
    )
    assert code == 2, lines
    (line,) = [ln for ln in lines if ln.startswith("error:")]
    assert "needs at least" in line and f"max_memory is {shown}" in line, line
