"""Fault injection (issue #13): every bad input and fault a user can cause, through the CLI and the API,
on a tiny synthetic trajectory. Each case asserts the message, the exit status, and that no
finished row is lost. The cases that already held are here too, so they stay held (a real SIGKILL
mid-sweep is tests/test_sweep_resume.py).

Exit statuses (README, "When things go wrong"): 0 ok; 1 some rows failed; 2 bad input; 3 every row
failed; 70 internal error; 130 interrupted.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from losslens.cli.app import app
from losslens.study.sweep import Plan, Store, StoreError, run_sweep
from losslens.study.sweep.lock import StoreLock, StoreLockedError, lock_path
from losslens.measure.probes.rows import ProbeRow, metric
from losslens.study.sweep.testing import tiny_plan_toml, tiny_token_sets, tiny_trajectory

CHEAP = 'loss = true\nquant = ["rtn:4"]\n'
N_CKPT = 4
ROWS = 2  # rows per checkpoint of CHEAP


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return tiny_trajectory(tmp_path_factory.mktemp("faults") / "tiny", n=N_CKPT, seed=3)


@pytest.fixture(scope="module")
def plan_file(pristine, tmp_path_factory):
    return tiny_plan_toml(tmp_path_factory.mktemp("plan") / "plan.toml", pristine, probes=CHEAP)


@pytest.fixture(scope="module")
def reference(pristine, plan_file, tmp_path_factory):
    """The rows of an uninterrupted sweep of the pristine trajectory: {(checkpoint, probe, spec, metric): value}."""
    out = tmp_path_factory.mktemp("ref") / "ref.sqlite"
    run_sweep(pristine, Plan.from_file(plan_file), out=out, progress=False, num_threads=1)
    return _values(out)


@pytest.fixture()
def traj(pristine, tmp_path):
    """A private copy of the trajectory (the token-set files stay in the pristine folder: same data)."""
    dst = tmp_path / "traj"
    shutil.copytree(pristine, dst, ignore=shutil.ignore_patterns("data"))
    return dst


def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _sweep(traj, out, plan_file, *extra):
    return _cli("sweep", traj, "--out", out, "--plan", plan_file, "--quiet", "--threads", "1", *extra)


def _values(path, status="ok") -> dict:
    with Store(path) as st:
        df = st.results()
    df = df[df.status == status]
    return {(r.checkpoint, r.probe, r.spec, r.metric): r.value for r in df.itertuples()}


def _errors(path) -> dict:
    with Store(path) as st:
        df = st.results()
    return {r.checkpoint: r.error for r in df[df.status == "failed"].itertuples()}


def _error_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith("error:")]


def _edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def _save_llama(folder: Path, hidden: int, seed: int = 0, vocab: int = 96) -> None:
    from transformers import LlamaForCausalLM

    from losslens.study.sweep.testing import tiny_config

    torch.manual_seed(seed)
    LlamaForCausalLM(tiny_config(hidden=hidden, vocab=vocab)).save_pretrained(folder, safe_serialization=True)


# ------------------------------------------------------------------------------------------------
# every checkpoint under its own config
# ------------------------------------------------------------------------------------------------
def test_each_checkpoint_is_evaluated_under_its_own_config(pristine, traj, plan_file, reference, tmp_path):
    from losslens.lm.checkpoints import load_model
    from losslens.lm.core.next_token_loss import evaluate

    _edit_config(traj / "step-000300", hidden_act="relu")
    out = tmp_path / "r.sqlite"
    r = _sweep(traj, out, plan_file)
    assert r.exit_code == 0, r.output
    assert "step-000300" in r.output and "hidden_act ('silu' -> 'relu')" in r.output and "its own config" in r.output
    got = _values(out)
    eval_set = tiny_token_sets(pristine)["eval"]
    own = evaluate(load_model(traj / "step-000300").eval(), eval_set).loss
    assert got[("step-000300", "loss", "", "loss")] == pytest.approx(own, rel=1e-12)
    # the first checkpoint's config (silu) would have given another number: the old, silent bug
    assert abs(reference[("step-000300", "loss", "", "loss")] - own) > 1e-4
    for key, v in reference.items():
        if key[0] != "step-000300":
            assert got[key] == v, key  # the other checkpoints: bit-identical


def test_config_that_allocates_more_than_the_weights_is_refused_before_allocating(traj, plan_file, reference, tmp_path):
    (traj / "step-000200" / "config.json").write_text(json.dumps({"model_type": "gpt_neox"}))  # 20.5B defaults
    _edit_config(traj / "step-000400", hidden_size=64)  # over 32-wide weights
    out = tmp_path / "r.sqlite"
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    r = _sweep(traj, out, plan_file)
    assert time.perf_counter() - t0 < 120
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 2 * 1024 * 1024  # < 2 GB (ru_maxrss in kB)
    assert r.exit_code == 1, r.output
    err = _errors(out)
    assert set(err) == {"step-000200", "step-000400"}
    assert "describes a GPTNeoXForCausalLM of 20.6B parameters (82.2 GB in float32)" in err["step-000200"]
    assert "weight files hold 26.8k parameters" in err["step-000200"] and "leaves out hidden_size" in err["step-000200"]
    assert (
        "LlamaForCausalLM of 53.6k parameters" in err["step-000400"] and "Nothing was allocated" in err["step-000400"]
    )
    assert "error: 4 of 8 rows failed (some" in r.output and "ArchitectureMismatchError x4" in r.output
    got = _values(out)
    assert {k: v for k, v in reference.items() if k[0] in ("step-000100", "step-000300")} == got
    again = _sweep(traj, out, plan_file)  # every rerun: the same clear failure, no crash
    assert again.exit_code == 1 and "4 kept from earlier runs" in again.output and _values(out) == got


def test_a_different_model_first_in_the_folder_fails_no_genuine_checkpoint(traj, plan_file, reference, tmp_path):
    _save_llama(traj / "step-000050", hidden=48, seed=5)
    out = tmp_path / "r.sqlite"
    r = _sweep(traj, out, plan_file)
    assert r.exit_code == 0, r.output
    assert "'step-000100' has a config that differs from 'step-000050'" in r.output
    got = _values(out)
    assert {k: v for k, v in got.items() if k[0] != "step-000050"} == reference
    assert ("step-000050", "loss", "", "loss") in got


def test_a_checkpoint_with_a_smaller_vocabulary_fails_with_a_clear_message(traj, plan_file, reference, tmp_path):
    _save_llama(traj / "step-000250", hidden=32, vocab=48)
    out = tmp_path / "r.sqlite"
    r = _sweep(traj, out, plan_file)
    assert r.exit_code == 1 and "ProbeError x2 (step-000250)" in r.output
    assert "vocabulary of 48 tokens but the sweep's token sets hold ids up to 9" in _errors(out)["step-000250"]
    assert _values(out) == reference


# ------------------------------------------------------------------------------------------------
# exit statuses and the failure summary
# ------------------------------------------------------------------------------------------------
def test_all_rows_failed_exits_3_with_a_summary_by_error_type(traj, plan_file, tmp_path):
    for i in range(1, N_CKPT + 1):
        (traj / f"step-{100 * i:06d}" / "model.safetensors").write_bytes(b"\x00garbage" * 64)
    out = tmp_path / "r.sqlite"
    r = _sweep(traj, out, plan_file)
    assert r.exit_code == 3, r.output
    assert f"error: {ROWS * N_CKPT} of {ROWS * N_CKPT} rows failed (all" in r.output
    assert f"CorruptCheckpointError x{ROWS * N_CKPT}" in r.output and "--retry-failed" in r.output
    with Store(out) as st:
        assert st.count("failed") == ROWS * N_CKPT


def test_checkpoints_that_already_failed_cleanly_stay_failed_rows(traj, plan_file, reference, tmp_path):
    """Truncated, zero-byte and NaN checkpoints: failed rows with clear messages, the rest untouched."""
    st = traj / "step-000200" / "model.safetensors"
    st.write_bytes(st.read_bytes()[: st.stat().st_size // 2])
    (traj / "step-000300" / "model.safetensors").write_bytes(b"")
    from safetensors.torch import load_file, save_file

    p = traj / "step-000400" / "model.safetensors"
    sd = load_file(str(p))
    sd["lm_head.weight"][0, 0] = float("nan")
    save_file(sd, str(p), metadata={"format": "pt"})
    out = tmp_path / "r.sqlite"
    r = _sweep(traj, out, plan_file)
    assert r.exit_code == 1, r.output
    err = _errors(out)
    assert "not a readable safetensors file" in err["step-000200"] and "CorruptCheckpointError" in err["step-000200"]
    assert "not a readable safetensors file" in err["step-000300"]
    assert "the evaluation loss is nan; the model's weights or the token set are broken" in err["step-000400"]
    assert {k: v for k, v in reference.items() if k[0] == "step-000100"} == _values(out)


def test_same_seed_gives_bit_identical_rows(pristine, tmp_path):
    plan = Plan.from_file(
        tiny_plan_toml(tmp_path / "p.toml", pristine, probes='trace = { method = "hutchinson", num_matvecs = 3 }\n')
    )
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    for out in (a, b):
        run_sweep(pristine, plan, out=out, progress=False, num_threads=1)
    assert _values(a) == _values(b) and len(_values(a)) == N_CKPT


# ------------------------------------------------------------------------------------------------
# interruptions: no finished row lost, the rerun bit-identical to an uninterrupted run
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("moment", [1, 4, 7])
def test_interrupted_sweep_keeps_every_finished_row(traj, plan_file, reference, tmp_path, monkeypatch, moment):
    from losslens.study.sweep import runner

    calls = {"n": 0}
    real = runner.PROBE_FUNCS["loss"], runner.PROBE_FUNCS["quant"]

    def counting(fn):
        def probe(st, task):
            calls["n"] += 1
            if calls["n"] == moment:
                raise KeyboardInterrupt
            return fn(st, task)

        return probe

    monkeypatch.setitem(runner.PROBE_FUNCS, "loss", counting(real[0]))
    monkeypatch.setitem(runner.PROBE_FUNCS, "quant", counting(real[1]))
    out = tmp_path / "r.sqlite"
    r = _sweep(traj, out, plan_file)
    assert r.exit_code == 130 and "error: interrupted" in r.output and "rerun the same command" in r.output
    with Store(out) as st:
        assert st.count("ok") == st.count() == moment - 1  # every probe finished before the interrupt is stored
    assert not lock_path(out).exists()
    monkeypatch.undo()
    again = _sweep(traj, out, plan_file)
    assert again.exit_code == 0 and f"{moment - 1} already done" in again.output
    assert _values(out) == reference


# ------------------------------------------------------------------------------------------------
# one writer per store; plans and data never mix silently
# ------------------------------------------------------------------------------------------------
def test_a_second_writer_is_refused_naming_the_holder(traj, plan_file, tmp_path):
    out = tmp_path / "r.sqlite"
    lock = StoreLock(out).acquire()
    try:
        r = _sweep(traj, out, plan_file)
        assert r.exit_code == 2, r.output
        (line,) = _error_lines(r.output)
        assert f"is being written by another sweep: PID {os.getpid()}" in line and "--wait" in line
        with pytest.raises(StoreLockedError, match=f"PID {os.getpid()}"):
            run_sweep(traj, Plan.from_file(plan_file), out=out, progress=False)
    finally:
        lock.release()
    assert not out.exists()  # refused before the store was even opened


def test_wait_queues_behind_the_holder(traj, plan_file, reference, tmp_path):
    out = tmp_path / "r.sqlite"
    lock = StoreLock(out).acquire()
    threading.Timer(1.0, lock.release).start()
    t0 = time.perf_counter()
    r = _sweep(traj, out, plan_file, "--wait")
    assert r.exit_code == 0, r.output
    assert (
        time.perf_counter() - t0 >= 0.9 and f"waiting for the sweep writing this store (PID {os.getpid()})" in r.output
    )
    assert _values(out) == reference


def test_the_plan_check_runs_in_the_transaction_of_the_first_write(tmp_path):
    """Two writers bind different plans to a fresh store (no rows yet, so both binds pass): the
    first to write wins, the other's first write is refused inside its transaction."""
    path = tmp_path / "r.sqlite"
    a, b = Plan(quant=("rtn:4",), name="a"), Plan(quant=("rtn:3",), name="b")
    first, second = Store(path), Store(path)
    try:
        first.bind(a, "data-a")
        second.bind(b, "data-b")
        second.write(ProbeRow("s1", "loss", "", metrics=[metric("loss", 1.0)]))
        with pytest.raises(StoreError, match="different plan"):
            first.write(ProbeRow("s1", "loss", "", metrics=[metric("loss", 2.0)]))
        assert second.meta["plan_hash"] == b.hash and second.count() == 1
        raw = second.raw()
        assert list(raw.plan_hash) == [b.hash] and list(raw.data_hash) == ["data-b"]
    finally:
        first.close()
        second.close()


def test_analysis_refuses_to_pool_different_data_unless_asked(pristine, plan_file, tmp_path):
    from losslens.lm.core.tokenset import TokenSet

    other = tmp_path / "other"
    g = torch.Generator().manual_seed(99)
    for name, nb in (("eval", 2), ("calibration", 2), ("curvature", 1)):
        TokenSet(torch.randint(0, 96, (nb, 2, 16), generator=g), name).save(other / "data" / f"{name}.safetensors")
    probes = CHEAP + 'trace = { method = "hutchinson", num_matvecs = 2 }\n'
    p1 = tiny_plan_toml(tmp_path / "p1.toml", pristine, probes=probes, name="one")
    p2 = tiny_plan_toml(tmp_path / "p2.toml", other, probes=probes, name="two")
    out = tmp_path / "r.sqlite"
    assert _sweep(pristine, out, p1).exit_code == 0
    refused = _sweep(pristine, out, p2)
    assert refused.exit_code == 2 and "different plan" in refused.output and "--allow-mixed" in refused.output
    mixed = _sweep(pristine, out, p2, "--allow-mixed")
    assert mixed.exit_code == 0, mixed.output
    r = _cli("correlate", out, "--x", "trace", "--y", "rtn:4", "--n-boot", "50")
    assert r.exit_code == 2, r.output
    (line,) = _error_lines(r.output)
    assert "2 different data sets" in line and "--allow-mixed" in line
    ok = _cli("correlate", out, "--x", "trace", "--y", "rtn:4", "--n-boot", "50", "--allow-mixed")
    assert ok.exit_code == 0, ok.output


def test_analysis_refuses_a_series_computed_with_different_settings():
    import pandas as pd

    from losslens.study.analysis import AnalysisError, series

    rows = [
        dict(
            run="r",
            checkpoint=f"s{i}",
            step=i,
            tokens=None,
            lr=1e-3,
            derived=False,
            probe="trace",
            spec="hutch++",
            metric="trace",
            value=float(i),
            status="ok",
            data_hash="d",
            config_hash="a" if i < 3 else "b",
        )
        for i in range(6)
    ]
    df = pd.DataFrame(rows)
    with pytest.raises(AnalysisError, match="2 different settings.*allow_mixed=True"):
        series(df, "trace")
    assert list(series(df, "trace", allow_mixed=True)) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


# ------------------------------------------------------------------------------------------------
# one-line errors, exit 2; tracebacks only with --debug
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (["--num-matvecs", "0"], "num_matvecs (--num-matvecs) must be an integer >= 3 for hutch++"),
        (["--num-matvecs", "2"], "num_matvecs (--num-matvecs) must be an integer >= 3 for hutch++"),
        (["--k", "0"], "k (--k) must be an integer >= 1, got 0"),
        (["--k", "100000"], "k must be <= the operator dimension"),
        (["--params", "nomatch.*"], "parameter glob 'nomatch.*' matches no trainable parameter"),
        (["--label", "step-000999"], "step-000999"),
        (["--max-memory", "lots"], "--max-memory: cannot read the size 'lots'"),  # tests/test_sizes.py: the full table
        (["--max-memory", "1MB"], "needs at least"),  # a plan that cannot fit: refused before any product
        (["--dtype", "int8"], "dtype 'int8' is unknown"),
    ],
)
def test_sharpness_bad_options_are_one_line_errors(pristine, args, message):
    budget = [] if "--num-matvecs" in args else ["--num-matvecs", "3"]
    r = _cli(
        "sharpness", pristine, *args, *budget, "--data", pristine / "data" / "curvature.safetensors", "--threads", "1"
    )
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    (line,) = _error_lines(r.output)
    assert message in line


def test_debug_shows_the_traceback_and_internal_errors_say_so(pristine, monkeypatch):
    from losslens.geometry.base.params import ParameterSelectionError
    from losslens.measure import sharpness as sharp_mod

    args = [
        "sharpness",
        pristine,
        "--params",
        "nomatch.*",
        "--num-matvecs",
        "3",
        "--data",
        pristine / "data" / "curvature.safetensors",
    ]
    r = _cli("--debug", *args)
    assert isinstance(r.exception, ParameterSelectionError)  # raised through: the traceback is shown
    r = _cli(*args, "--debug")  # also after the command name
    assert isinstance(r.exception, ParameterSelectionError)

    def bug(*a, **k):
        return 1 / 0

    monkeypatch.setattr(sharp_mod, "measure_sharpness", bug)
    r = _cli("sharpness", pristine)
    assert r.exit_code == 70 and "Traceback" not in r.output
    (line,) = _error_lines(r.output)
    assert "internal error ZeroDivisionError" in line and "--debug" in line


def _damage(good: Path, tmp: Path) -> dict[str, Path]:
    data = good.read_bytes()
    out = {"random": tmp / "random.sqlite", "truncated": tmp / "truncated.sqlite", "pages": tmp / "pages.sqlite"}
    out["random"].write_bytes(np.random.default_rng(0).bytes(8192))
    out["truncated"].write_bytes(data[: len(data) // 2])
    d = bytearray(data)
    rng = np.random.default_rng(1)
    for off in range(4096 + 100, len(d), 4096):
        d[off : off + 200] = rng.bytes(200)
    out["pages"].write_bytes(bytes(d))
    return out


def test_damaged_stores_are_one_line_errors(pristine, plan_file, tmp_path):
    good = tmp_path / "good.sqlite"
    run_sweep(pristine, Plan.from_file(plan_file), out=good, progress=False, num_threads=1)
    con = sqlite3.connect(good)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    for kind, path in _damage(good, tmp_path).items():
        for args in (
            ["report", path, "--out", tmp_path / "r.html"],
            ["correlate", path],
            ["sweep", pristine, "--out", path, "--plan", plan_file, "--quiet"],
        ):
            r = _cli(*args)
            assert r.exit_code == 2, (kind, args[0], r.output)
            assert "Traceback" not in r.output
            (line,) = _error_lines(r.output)
            assert str(path) in line and ("damaged" in line or "not a losslens results store" in line), line
    assert not (tmp_path / "r.html").exists()


def test_pickle_refusal_names_a_flag_that_exists(pristine, traj, plan_file, reference, tmp_path):
    from safetensors.torch import load_file

    folder = traj / "step-000200"
    sd = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save({"state_dict": sd, "trainer": _Custom()}, folder / "pytorch_model.bin")
    out = tmp_path / "r.sqlite"
    r = _sweep(traj, out, plan_file)
    assert r.exit_code == 1 and "UnsafeCheckpointError x2" in r.output
    assert "(CLI: --allow-pickle)" in _errors(out)["step-000200"]
    with pytest.warns(UserWarning, match="full pickle"):
        fixed = _sweep(traj, out, plan_file, "--allow-pickle", "--retry-failed")
    assert fixed.exit_code == 0, fixed.output
    assert _values(out) == reference
    r = _cli("quantize", folder, "--spec", "rtn:4", "--eval-set", pristine / "data" / "eval.safetensors", "--json")
    assert r.exit_code == 2 and "--allow-pickle" in r.output


class _Custom:  # unpickling it needs arbitrary code
    pass


def test_nan_surface_is_an_error(pristine, traj, tmp_path):
    from safetensors.torch import load_file, save_file

    p = traj / "step-000400" / "model.safetensors"
    sd = load_file(str(p))
    sd["lm_head.weight"][0, 0] = float("nan")
    save_file(sd, str(p), metadata={"format": "pt"})
    page = tmp_path / "s.html"
    for extra in ([], ["--random-plane"]):
        r = _cli(
            "surface",
            traj / "step-000400",
            "--spec",
            "rtn:4",
            "--grid",
            "3",
            "--data",
            pristine / "data" / "eval.safetensors",
            "--out",
            page,
            "-q",
            *extra,
        )
        assert r.exit_code == 2, r.output
        (line,) = _error_lines(r.output)
        assert "non-finite (NaN/inf) weights" in line and "lm_head.weight" in line
    # B (the previous checkpoint) NaN: the surface is refused after evaluation, no page
    with pytest.warns(RuntimeWarning, match="non-finite"):
        r = _cli(
            "surface",
            traj / "step-000300",
            "--previous",
            traj / "step-000400",
            "--grid",
            "3",
            "--data",
            pristine / "data" / "eval.safetensors",
            "--out",
            page,
            "-q",
        )
    assert r.exit_code == 2 and "is not finite" in r.output
    assert not page.exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--method", "bogus"], "unknown correlation method 'bogus'; valid: pearson, spearman, kendall"),
        (["--n-boot", "0"], "n_boot must be >= 40, got 0"),
        (["--n-boot", "-5"], "n_boot must be >= 40, got -5"),
    ],
)
def test_correlate_bad_method_and_n_boot(pristine, plan_file, tmp_path, args, message):
    out = tmp_path / "r.sqlite"
    run_sweep(
        pristine,
        Plan.from_file(tiny_plan_toml(tmp_path / "p.toml", pristine, probes=CHEAP + "kurtosis = true\n")),
        out=out,
        progress=False,
        num_threads=1,
    )
    r = _cli("correlate", out, "--x", "kurtosis", "--y", "rtn:4", *args)
    assert r.exit_code == 2, r.output
    (line,) = _error_lines(r.output)
    assert message in line
    r = _cli("report", out, "--out", tmp_path / "r.html", *args[-2:]) if "--n-boot" in args else None
    assert r is None or (r.exit_code == 2 and message in r.output)


def test_quick_with_a_plan_is_an_error(pristine, plan_file, tmp_path):
    r = _sweep(pristine, tmp_path / "r.sqlite", plan_file, "--quick")
    assert r.exit_code == 2
    (line,) = _error_lines(r.output)
    assert "--quick shrinks the built-in plan and cannot change a --plan file" in line
    assert not (tmp_path / "r.sqlite").exists()


def test_sharpness_of_a_checkpoint_folder_reads_lr_and_tokens(pristine):
    r = _cli(
        "sharpness",
        pristine / "step-000200",
        "--num-matvecs",
        "3",
        "--data",
        pristine / "data" / "curvature.safetensors",
        "--threads",
        "1",
        "--json",
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{") :])
    entry = next(e for e in json.loads((pristine / "trajectory.json").read_text())["checkpoints"] if e["step"] == 200)
    assert (
        out["lr"] == pytest.approx(entry["lr"]) and out["tokens"] == entry["tokens"] == 200 * 64 and out["step"] == 200
    )


def test_threads_are_recorded_with_each_row(pristine, plan_file, tmp_path):
    out = tmp_path / "r.sqlite"
    run_sweep(pristine, Plan.from_file(plan_file), out=out, progress=False, num_threads=1)
    with Store(out) as st:
        assert set(st.raw()["threads"]) == {1}
        assert (st.results()["threads"] == 1).all()


def test_bad_device_and_executor_stop_before_any_work(pristine, plan_file, tmp_path):
    out = tmp_path / "r.sqlite"
    for args in (
        ["sweep", pristine, "--out", out, "--plan", plan_file, "--device", "bogus", "--quiet"],
        [
            "sharpness",
            pristine,
            "--device",
            "bogus",
            "--num-matvecs",
            "3",
            "--data",
            pristine / "data" / "curvature.safetensors",
        ],
    ):
        r = _cli(*args)
        assert r.exit_code == 2, r.output
        (line,) = _error_lines(r.output)
        assert "device 'bogus' cannot be used here" in line
    assert not out.exists()
    r = _cli("demo", "--executor", "bogus", "--out", tmp_path / "demo", "--quiet")
    assert r.exit_code == 2 and "unknown executor 'bogus'; valid: local, ray" in r.output
    assert not (tmp_path / "demo").exists()  # refused before minutes of training
