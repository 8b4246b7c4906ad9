"""run_sweep's options travel as one SweepOptions; its fields are run_sweep's former keywords."""

from __future__ import annotations

from dataclasses import fields

import pytest

from losslens.study.sweep import Plan, Store, SweepOptions, run_sweep
from losslens.study.sweep.testing import tiny_token_sets, tiny_trajectory

FORMER_KEYWORDS = [
    "executor",
    "address",
    "retry_failed",
    "allow_mixed",
    "token_sets",
    "progress",
    "device",
    "dtype",
    "num_workers",
    "num_gpus",
    "num_threads",
    "on_row",
    "run",
    "wait",
    "on_wait",
    "allow_pickle",
    "pool",
    "parallel",
]


def test_the_fields_are_the_former_keywords_with_their_defaults():
    assert [f.name for f in fields(SweepOptions)] == FORMER_KEYWORDS
    o = SweepOptions()
    assert (o.executor, o.progress, o.parallel, o.retry_failed, o.num_workers) == ("local", True, "none", False, None)
    assert o.with_overrides(executor="ray", num_gpus=0.5) == SweepOptions(executor="ray", num_gpus=0.5)
    with pytest.raises(TypeError, match="unknown option.*'colour'"):
        o.with_overrides(colour=1)


def test_options_and_keywords_give_the_same_rows(tmp_path):
    traj = tiny_trajectory(tmp_path / "t", n=2, seed=2)
    plan = Plan.from_dict(
        {
            "name": "o",
            "data": {"eval": [2, 2, 16], "calibration": [2, 2, 16], "curvature": [1, 2, 16]},
            "probes": {"loss": True, "kurtosis": True},
        }
    )
    sets = tiny_token_sets(traj)
    seen = []
    a = run_sweep(
        traj,
        plan,
        tmp_path / "a.sqlite",
        SweepOptions(token_sets=sets, progress=False, num_threads=1),
        num_workers=1,
        on_row=seen.append,
    )
    b = run_sweep(traj, plan, out=tmp_path / "b.sqlite", token_sets=sets, progress=False, num_threads=1, num_workers=1)
    assert a.n_ok == b.n_ok == 4 and len(seen) == 4 and a.workers == b.workers == 1
    with Store(tmp_path / "a.sqlite") as sa, Store(tmp_path / "b.sqlite") as sb:
        cols = ["checkpoint", "probe", "spec", "metric", "value"]
        assert sa.results()[cols].equals(sb.results()[cols])
    with pytest.raises(TypeError, match="unknown option"):
        run_sweep(traj, plan, tmp_path / "c.sqlite", colour=1)
