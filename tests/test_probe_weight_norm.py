"""The ``weight_norm`` probe (‖W‖_F and the RMS weight of the matrices a quantizer quantizes), against
a direct computation that shares none of its code: the safetensors file read with numpy, the
matrices chosen by their names in the file."""

from __future__ import annotations

import json
import math
from fnmatch import fnmatch

import numpy as np
import pytest

from losslens.study.sweep import Plan, PlanError, Store, run_sweep
from losslens.study.sweep.testing import tiny_token_sets, tiny_trajectory


def test_plan_weight_norm_settings_tasks_and_hash():
    p = Plan.from_dict({"probes": {"weight_norm": True}})
    assert p.weight_norm is True and [t.key for t in p.tasks()] == [("weight_norm", "")]
    assert Plan.from_dict(p.to_dict()) == p and p.to_dict()["probes"] == {"weight_norm": True}
    assert "weight_norm" not in Plan.default().to_dict()["probes"]  # off: older plans keep their hash
    with pytest.raises(PlanError, match="weight_norm must be true or false"):
        Plan.from_dict({"probes": {"weight_norm": "yes"}})


def _direct(checkpoint, pattern: str) -> tuple[float, float, dict[str, float]]:
    from safetensors.numpy import load_file

    tensors = load_file(str(checkpoint / "model.safetensors"))
    chosen = {n: t.astype(np.float64) for n, t in tensors.items() if fnmatch(n, pattern) and t.ndim == 2}
    squares = {n[: -len(".weight")]: float(np.sum(t * t)) for n, t in chosen.items()}
    total, count = sum(squares.values()), sum(t.size for t in chosen.values())
    return math.sqrt(total), math.sqrt(total / count), {n: math.sqrt(s) for n, s in squares.items()}


def test_weight_norm_rows_equal_a_direct_computation(tmp_path):
    traj = tiny_trajectory(tmp_path / "t", n=2, seed=3)
    plan = Plan.from_dict({"name": "w", "probes": {"weight_norm": True}})
    out = tmp_path / "r.sqlite"
    rep = run_sweep(traj, plan, out=out, token_sets=tiny_token_sets(traj), progress=False, num_threads=1, num_workers=1)
    assert rep.n_failed == 0, rep.failures
    with Store(out) as st:
        df = st.results()
        raw = st.raw()
    assert set(df["probe"]) == {"weight_norm"}
    for ck in ("step-000100", "step-000200"):
        rows = df[df.checkpoint == ck].set_index("metric")["value"]
        fro, rms, per = _direct(traj / ck, "model.layers.*.weight")  # every Linear in the decoder blocks
        assert rows["frobenius"] == pytest.approx(fro, rel=1e-12) and rows["rms"] == pytest.approx(rms, rel=1e-12)
        extra = raw[(raw.checkpoint == ck) & (raw.probe == "weight_norm")]["extra"].iloc[0]
        extra = json.loads(extra) if isinstance(extra, str) else extra
        assert set(extra["per_matrix"]) == set(per) and len(per) == 14  # 7 Linear per layer, 2 layers
        for name, norm in per.items():
            assert extra["per_matrix"][name] == pytest.approx(norm, rel=1e-12)
