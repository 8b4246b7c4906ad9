"""How soon a long command says something: seconds from process start to its first progress line (issue #49).

``python -m benchmarks.first_progress CHECKPOINT [--repeats 3] [--threads 1] [--json rows.json] [-- ARGS...]``

Runs ``losslens sharpness CHECKPOINT --quick --threads T`` (or the ``ARGS`` after ``--``) ``repeats``
times, each in a fresh process with stderr read through a pipe (as a log sees it, plain lines), and
times from ``Popen`` to: the first ``[label]`` line on stderr (a stage line such as "building the
curvature set"), the first ``planned:`` line (the products planned and the time the first one
implies), and the exit. Prints one row per run and the load average (1 min) before it: on a shared
machine the seconds move with the load, so a row states it. The issue's goal: the first progress
line of ``sharpness --quick`` on the demo checkpoint within 15 s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

GOAL_S = 15.0


def run_once(args: list[str], env: dict) -> dict:
    """One run of ``losslens ARGS`` through a pipe: the seconds to its first progress line, its first
    ``planned:`` line and its exit, and the first line's text."""
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "losslens", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    first = planned = None
    first_text = ""
    assert proc.stderr is not None
    for line in proc.stderr:
        now = time.perf_counter() - t0
        if first is None and re.match(r"\[[\w-]+\] ", line):
            first, first_text = now, line.strip()
        if planned is None and re.match(r"\[[\w-]+\] planned: ", line):
            planned = now
    rc = proc.wait()
    total = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"losslens {' '.join(args)} exited with {rc}")
    return {
        "first_line_s": first,
        "planned_line_s": planned,
        "total_s": total,
        "load_1min": load,
        "first_line": first_text,
        "goal_met": first is not None and first <= GOAL_S,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", dest="json_out")
    a = ap.parse_args(argv)
    args = extra or ["sharpness", a.checkpoint, "--quick", "--threads", str(a.threads)]
    env = {**os.environ, "LOSSLENS_PROGRESS_EVERY": "10"}
    rows = []
    print(f"losslens {' '.join(args)} ({a.repeats} runs, stderr through a pipe)")
    print("| run | load avg (1 min) before | first progress line | first `planned:` line | total | ≤ 15 s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for i in range(a.repeats):
        row = {"run": i + 1, **run_once(args, env)}
        rows.append(row)
        fmt = lambda v: "–" if v is None else f"{v:.1f} s"  # noqa: E731
        print(
            f"| {row['run']} | {row['load_1min']:.1f} | {fmt(row['first_line_s'])} | {fmt(row['planned_line_s'])} "
            f"| {fmt(row['total_s'])} | {'yes' if row['goal_met'] else 'no'} |",
            flush=True,
        )
    print(f"first line: {rows[0]['first_line']}")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
