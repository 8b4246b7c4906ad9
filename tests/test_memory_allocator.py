"""geometry.memory.model: with its settings, freed tensor memory leaves the process's resident
memory (the mechanism; benchmarks/README.md "Scale" measures why the CLI does not use it)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from geometry.memory.model import _libc

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import sys, torch
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024
if sys.argv[1] == "cli":
    from geometry.memory.model import return_freed_memory
    assert return_freed_memory()
big = torch.ones(4 << 20); del big            # a 16 MB block freed: glibc raises its mmap threshold to it
base = rss()
keep, tmp = [], []
for i in range(100):
    tmp.append(torch.ones(1 << 19))           # 2 MB each, freed below
    keep.append(torch.ones(30000))            # kept: pins the heap above the freed blocks
held = rss() - base
del tmp
print(held, rss() - base)
"""


def _run(mode: str) -> tuple[int, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], env=env, capture_output=True, text=True, check=True)
    held, left = map(int, out.stdout.split())
    return held, left


@pytest.mark.skipif(not sys.platform.startswith("linux") or _libc() is None, reason="glibc malloc only")
def test_freed_tensors_leave_resident_memory_with_the_cli_settings():
    held, left = _run("glibc")
    assert held > 190e6 and left > 0.9 * held         # glibc's default keeps the freed 200 MB resident
    held, left = _run("cli")
    assert held > 190e6 and left < 0.15 * held        # returned to the OS (the kept tensors stay)
