"""Results do not depend on how much memory happens to be free (issue #22, item 3): the default
budget is a fraction of the *total* memory, the settings a memory plan chose are part of a row's
identity (the ``chosen`` column), and analysis refuses to pool rows whose chosen settings differ."""

from __future__ import annotations

import json

import pytest
import torch

import losslens.geometry.memory.budget as budget
from losslens.geometry.memory.model import NEUTRAL_SETTINGS, identity_settings
from losslens.geometry.memory.budget import MEMORY_FRACTION_ENV, default_budget, total_bytes
from losslens.study.analysis.inputs import AnalysisError
from losslens.study.analysis.series import series
from losslens.lm.models.curvature import lm_hessian
from losslens.study.sweep import Store, run_sweep
from losslens.study.sweep.testing import tiny_plan_toml, tiny_trajectory
from tests.tiny_models import micro_gptneox, random_batches

PROBES = 'trace = { method = "hutch++", num_matvecs = 30 }\n'


@pytest.fixture(scope="module")
def traj(tmp_path_factory):
    return tiny_trajectory(tmp_path_factory.mktemp("ident") / "tiny", n=2, seed=3)


def _free(monkeypatch, nbytes: int) -> None:
    """Pretend the host has ``nbytes`` of RAM available right now."""
    monkeypatch.setattr(budget, "_host_available", lambda: int(nbytes))


def test_the_default_budget_does_not_follow_free_memory(monkeypatch):
    monkeypatch.delenv(MEMORY_FRACTION_ENV, raising=False)
    _free(monkeypatch, 2**30)
    low = default_budget("cpu")
    _free(monkeypatch, 16 * 2**30)
    assert default_budget("cpu") == low == int(budget.CPU_FRACTION * total_bytes("cpu"))
    monkeypatch.setenv(MEMORY_FRACTION_ENV, "0.05")
    assert default_budget("cpu") == int(0.05 * total_bytes("cpu"))


def _trace_rows(path):
    with Store(path) as st:
        df = st.results()
    rows = df[(df.probe == "trace") & (df.metric == "trace")]
    return rows.set_index("checkpoint")


def _sweep(traj, plan, out, monkeypatch, free: int, fraction: float):
    monkeypatch.setenv(MEMORY_FRACTION_ENV, repr(fraction))
    _free(monkeypatch, free)
    rep = run_sweep(traj, plan, out=out, progress=False, num_threads=1, num_workers=1)
    assert rep.n_failed == 0, rep.failures


def _binding_fraction(traj, tmp_path, monkeypatch, plan) -> float:
    """A budget fraction (of total RAM) under which Hutch++ cannot hold its full sketch of 10."""
    _sweep(traj, plan, tmp_path / "free.sqlite", monkeypatch, free=total_bytes("cpu"), fraction=0.5)
    with Store(tmp_path / "free.sqlite") as st:
        extra = json.loads(st.raw().query("probe == 'trace'").extra.iloc[0])
    assert extra["memory"]["settings"]["sketch_size"] == 10
    return (extra["memory"]["predicted_bytes"] - 1) / total_bytes("cpu")


def test_two_runs_under_different_free_memory_give_the_same_numbers(traj, tmp_path, monkeypatch):
    plan = tiny_plan_toml(tmp_path / "p.toml", traj, probes=PROBES)
    frac = _binding_fraction(traj, tmp_path, monkeypatch, plan)
    total = total_bytes("cpu")
    _sweep(traj, plan, tmp_path / "a.sqlite", monkeypatch, free=total, fraction=frac)
    _sweep(traj, plan, tmp_path / "b.sqlite", monkeypatch, free=total // 5, fraction=frac)
    a, b = _trace_rows(tmp_path / "a.sqlite"), _trace_rows(tmp_path / "b.sqlite")
    chosen = json.loads(a.chosen.iloc[0])
    assert 0 < chosen["sketch_size"] < 10  # the cap binds ...
    assert list(a.chosen) == list(b.chosen)  # ... the same way under both
    assert list(a.value) == list(b.value) and list(a.stderr) == list(b.stderr)


def test_rows_whose_chosen_settings_differ_are_not_pooled(traj, tmp_path, monkeypatch):
    plan = tiny_plan_toml(tmp_path / "p.toml", traj, probes=PROBES)
    frac = _binding_fraction(traj, tmp_path, monkeypatch, plan)
    out = tmp_path / "mixed.sqlite"
    _sweep(traj, plan, out, monkeypatch, free=total_bytes("cpu"), fraction=0.5)
    with Store(out) as st:  # the second checkpoint lost (killed sweep) ...
        with st.conn:
            st.conn.execute("DELETE FROM results WHERE checkpoint = 'step-000200'")
    _sweep(traj, plan, out, monkeypatch, free=total_bytes("cpu"), fraction=frac)  # ... resumed with less memory
    rows = _trace_rows(out)
    assert rows.chosen.nunique() == 2 and rows.config_hash.nunique() == 1
    with Store(out) as st:
        df = st.results()
    with pytest.raises(AnalysisError, match="chose 2 different settings.*sketch_size.*allow_mixed"):
        series(df, "trace")
    pooled = series(df, "trace", allow_mixed=True)
    assert list(pooled.values) == list(rows.value)


def test_keeping_graphs_between_products_does_not_change_the_numbers():
    """cache_graphs is the one chosen setting left out of a row's identity: the products are
    bit-identical with the graphs kept or rebuilt (float32, the sweeps' dtype; float64 in
    test_memory_budget.py)."""
    model = micro_gptneox(seed=2, dtype=torch.float32)
    op = lm_hessian(model, random_batches(n_batches=2, batch=2, seq=8, seed=1))
    V = torch.randn(3, op.dim, generator=torch.Generator().manual_seed(0))
    with op.configured(cache_graphs=False):
        plain = op.matmat_flat(V)
    with op.configured(cache_graphs=True):
        kept = torch.cat([op.matmat_flat(V[:1]), op.matmat_flat(V[1:])])
    assert torch.equal(plain, kept)
    assert NEUTRAL_SETTINGS == {"cache_graphs"}
    assert identity_settings({"settings": {"cache_graphs": True, "block_size": 2}}) == {"block_size": 2}
    assert identity_settings(None) == {} and identity_settings({}) == {}
