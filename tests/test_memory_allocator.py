"""losslens.geometry.memory.allocator: with its settings, freed tensor memory leaves the process's resident
memory (the mechanism; benchmarks/README.md "Scale" measures what it does to peak RSS against the
plan, and why ``--strict-memory`` uses a 64 kB threshold and is not the default)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from losslens.geometry.memory.allocator import _libc

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import sys, torch
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024
if sys.argv[1] == "cli":
    from losslens.geometry.memory.allocator import return_freed_memory
    assert return_freed_memory()
if sys.argv[1] == "strict":                   # what `losslens sharpness/sweep/explain --strict-memory` does
    import os
    from losslens.cli.option_groups import apply_strict_memory
    apply_strict_memory(True)
    assert os.environ["MALLOC_MMAP_THRESHOLD_"] == "65536"   # for the workers it starts
size = int(sys.argv[2])
big = torch.ones(4 << 20); del big            # a 16 MB block freed: glibc raises its mmap threshold to it
base = rss()
keep, tmp = [], []
for i in range((200 << 20) // (4 * size)):
    tmp.append(torch.ones(size))              # 200 MB in all, freed below
    keep.append(torch.ones(size // 64))       # kept: pins the heap above the freed blocks
held = rss() - base
del tmp
print(held, rss() - base)
"""


def _run(mode: str, size: int = 1 << 19) -> tuple[int, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode, str(size)], env=env, capture_output=True, text=True, check=True
    )
    held, left = map(int, out.stdout.split())
    return held, left


@pytest.mark.skipif(not sys.platform.startswith("linux") or _libc() is None, reason="glibc malloc only")
def test_freed_tensors_leave_resident_memory_with_the_cli_settings():
    held, left = _run("glibc")
    assert held > 190e6 and left > 0.9 * held  # glibc's default keeps the freed 200 MB resident
    held, left = _run("cli")
    assert held > 190e6 and left < 0.15 * held  # returned to the OS (the kept tensors stay)


@pytest.mark.skipif(not sys.platform.startswith("linux") or _libc() is None, reason="glibc malloc only")
def test_strict_memory_returns_activation_sized_blocks_that_the_cli_settings_keep():
    """256 kB blocks (a Pythia-70m activation is 0.5 MB, 14m's 128 kB): kept by glibc's defaults and
    by the 1 MiB threshold, returned with ``--strict-memory``'s 64 kB."""
    size = 64 << 10  # float32 numbers: 256 kB
    held, left = _run("cli", size)
    assert held > 190e6 and left > 0.9 * held
    held, left = _run("strict", size)
    assert held > 190e6 and left < 0.15 * held


@pytest.mark.parametrize(
    "strict, max_memory, on",
    [
        (None, None, False),  # the default budget: a third of the RAM leaves room for glibc's kept memory
        (None, "8GB", True),  # a budget given on the command line is a cap
        (False, "8GB", False),  # --no-strict-memory
        (True, None, True),  # --strict-memory
    ],
)
def test_strict_memory_is_on_when_a_budget_is_given(strict, max_memory, on):
    from losslens.cli.option_groups import apply_strict_memory

    assert apply_strict_memory(strict, max_memory) is on  # (conftest keeps the real setting out of this process)
