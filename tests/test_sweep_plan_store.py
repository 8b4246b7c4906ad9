"""losslens.study.sweep plan validation/hashing and the SQLite store (no models needed)."""

from __future__ import annotations

import math
import re
import sqlite3
from dataclasses import dataclass

import pandas as pd
import pytest

from losslens.study.sweep import DataSpec, Plan, PlanError, Store, StoreError, TraceProbe
from losslens.study.sweep import RESULT_COLUMNS
from losslens.measure.probes.rows import ProbeRow, metric


# --------------------------------------------------------------------------- plan
def test_plan_validation_messages(tmp_path):
    from losslens.measure.probes.registry import PROBES

    assert {"loss", "quant", "trace", "eigen", "block_trace", "directional", "kurtosis", "explain", "accuracy"} <= set(
        PROBES
    )
    with pytest.raises(PlanError, match=r"unknown probe.*valid probes: " + re.escape(", ".join(PROBES)) + "$"):
        Plan.from_dict({"probes": {"loss": True, "hessian_trace": {}}})
    with pytest.raises(PlanError, match="invalid quantizer spec 'zz:4'|unknown quantizer"):
        Plan(quant=("zz:4",))
    with pytest.raises(PlanError, match="trace method 'exact' is unknown; valid: hutch\\+\\+, hutchinson"):
        Plan(trace={"method": "exact"})
    with pytest.raises(PlanError, match="unknown option.*valid options: method, num_matvecs"):
        Plan(trace={"num_probes": 10})
    with pytest.raises(PlanError, match="unknown plan key"):
        Plan.from_dict({"probes": {"loss": True}, "sead": 1})
    with pytest.raises(PlanError, match="data.eval must be three positive integers"):
        Plan(data={"eval": [4, 4]})
    with pytest.raises(PlanError, match="no probe"):
        Plan(loss=False)
    with pytest.raises(PlanError, match="lawa entries"):
        Plan(lawa=(1,))
    with pytest.raises(PlanError, match="more than once"):
        Plan(quant=("rtn:4", "rtn:4:g128"))
    bad = tmp_path / "p.toml"
    bad.write_text("[probes\nloss = true\n")
    with pytest.raises(PlanError, match="not a valid toml"):
        Plan.from_file(bad)


def test_plan_files_and_hash(tmp_path):
    toml = tmp_path / "plan.toml"
    toml.write_text(
        'name = "a"\nseed = 1\nlawa = [3]\n[data]\neval = [2, 2, 16]\ncalibration = [1, 2, 16]\n'
        "curvature = [1, 2, 16]\n"
        '[probes]\nloss = true\nquant = ["rtn:4", "int8"]\ntrace = { method = "hutchinson", num_matvecs = 8 }\n'
        'eigen = { k = 2 }\nblock_trace = { groups = { attn = "*attention*" }, num_matvecs = 4 }\n'
        'directional = ["rtn:4"]\nkurtosis = true\n'
    )
    p = Plan.from_file(toml)
    assert p.seed == 1 and p.lawa == (3,) and p.data.eval == (2, 2, 16)
    assert p.trace == TraceProbe("hutchinson", 8) and p.eigen.k == 2
    keys = [t.key for t in p.tasks()]
    assert keys[0] == ("loss", "") and ("eigen", "top2") in keys and ("block_trace", "custom") in keys
    assert ("quant", "rtn:4:g128") in keys or ("quant", "rtn:4") in keys
    yaml_path = tmp_path / "plan.yaml"
    import yaml

    yaml_path.write_text(yaml.safe_dump(p.to_dict()))
    q = Plan.from_file(yaml_path)
    assert q == p and q.hash == p.hash
    # the name does not change the hash; any number does
    assert p.replace(name="b").hash == p.hash
    assert p.replace(seed=2).hash != p.hash
    assert p.replace(data=DataSpec(eval=(2, 2, 16), calibration=(1, 2, 16), curvature=(1, 2, 17))).hash != p.hash
    # a setting change changes exactly that task's config hash
    t1 = {t.key: t.config_hash for t in p.tasks()}
    t2 = {t.key: t.config_hash for t in p.replace(trace=TraceProbe("hutchinson", 9)).tasks()}
    assert [k for k in t1 if t1[k] != t2[k]] == [("trace", "hutchinson")]
    # a [probes] table switches unlisted probes off
    assert not Plan.from_dict({"probes": {"kurtosis": True}}).loss


# --------------------------------------------------------------------------- store
@dataclass(frozen=True)
class Ref:
    label: str
    step: int | None
    tokens: int | None
    lr: float | None
    kind: str = "hf_dir"
    location: str | None = None


def _rows(label):
    return [
        ProbeRow(label, "loss", "", metrics=[metric("loss", 3.0), metric("ppl", math.exp(3.0))], seconds=0.5),
        ProbeRow(
            label,
            "quant",
            "rtn:4:g128",
            metrics=[metric("q_loss", 3.1), metric("rel_loss_error", 0.1 / 3), metric("ppl_gap", math.expm1(0.1))],
        ),
        ProbeRow(label, "trace", "hutch++", metrics=[metric("trace", 100.0, 2.0, 96.0, 104.0)], n_hvp=30),
        ProbeRow(
            label,
            "block_trace",
            "block",
            metrics=[metric("trace", 60.0, 1.0, spec="block0"), metric("trace", 40.0, 1.0, spec="block1")],
            n_hvp=10,
        ),
    ]


def test_store_roundtrip_tidy_columns_and_export(tmp_path):
    plan = Plan(quant=("rtn:4",), trace=TraceProbe("hutch++", 30))
    path = tmp_path / "r.sqlite"
    with Store(path) as st:
        st.bind(plan, "d" * 64, {"eval": "e"})
        st.add_checkpoints(
            [Ref("s100", 100, 1000, 1e-3), Ref("s200", 200, 2000, 5e-4), Ref("lawa2", None, None, None, "derived")]
        )
        for label in ("s200", "s100"):
            for r in _rows(label):
                st.write(r)
        st.write(ProbeRow("lawa2", "loss", "", status="failed", error="RuntimeError: boom"))
        df = st.results()
        assert list(df.columns) == RESULT_COLUMNS
        # ordered by checkpoint position, then probe order
        assert list(dict.fromkeys(df.checkpoint)) == ["s100", "s200", "lawa2"]
        s100 = df[df.checkpoint == "s100"]
        assert list(s100.metric) == ["loss", "ppl", "q_loss", "rel_loss_error", "ppl_gap", "trace", "trace", "trace"]
        assert list(s100[s100.probe == "block_trace"].spec) == ["block0", "block1"]
        tr = s100[s100.probe == "trace"].iloc[0]
        assert (tr.value, tr.stderr, tr.ci_low, tr.ci_high, tr.n_hvp) == (100.0, 2.0, 96.0, 104.0, 30)
        assert tr.step == 100 and tr.tokens == 1000 and tr.lr == 1e-3 and not tr.derived and tr.data_hash == "d" * 64
        assert math.isnan(s100[s100.metric == "loss"].iloc[0].stderr)
        failed = df[df.checkpoint == "lawa2"].iloc[0]
        assert (
            failed.status == "failed"
            and failed.error == "RuntimeError: boom"
            and failed.derived
            and pd.isna(failed.step)
        )
        assert pd.isna(failed.metric) and math.isnan(failed.value)
        assert st.meta["plan_hash"] == plan.hash and st.meta["data_hashes"] == {"eval": "e"}
        assert st.plan == plan
        csv = st.export(tmp_path / "out.csv")
        back = pd.read_csv(csv)
        assert list(back.columns) == RESULT_COLUMNS and len(back) == len(df)
        pq = st.export(tmp_path / "out.parquet")
        assert pd.read_parquet(pq).shape == df.shape
        with pytest.raises(StoreError, match=".csv or .parquet"):
            st.export(tmp_path / "out.xlsx")


def test_store_unique_rows_upsert_and_pending(tmp_path):
    plan = Plan(quant=("rtn:4",))
    tasks = plan.tasks()
    with Store(tmp_path / "r.sqlite") as st:
        st.bind(plan, "h")
        st.add_checkpoints([Ref("a", 1, 1, 1.0)])
        assert [t.key for t in st.pending("a", tasks, "h")] == [t.key for t in tasks]
        st.write(
            ProbeRow("a", "loss", "", metrics=[metric("loss", 1.0)], config_hash=tasks[0].config_hash), data_hash="h"
        )
        st.write(ProbeRow.failed("a", tasks[1], ValueError("bad")), data_hash="h")
        assert [t.probe for t in st.pending("a", tasks, "h")] == []
        assert [t.probe for t in st.pending("a", tasks, "h", retry_failed=True)] == ["quant"]
        assert [t.probe for t in st.pending("a", tasks, "other-data")] == ["loss", "quant"]
        # the same key again replaces the row (no duplicate)
        st.write(
            ProbeRow("a", "quant", tasks[1].spec, metrics=[metric("q_loss", 2.0)], config_hash=tasks[1].config_hash),
            data_hash="h",
        )
        assert st.count() == 2 and st.count("failed") == 0
    con = sqlite3.connect(tmp_path / "r.sqlite")
    with pytest.raises(sqlite3.IntegrityError):
        con.execute(
            "INSERT INTO results(run, checkpoint, probe, spec, status) VALUES (?, 'a', 'loss', '', 'ok')", (plan.name,)
        )
    con.close()


def test_mixed_plan_refused_unless_allowed(tmp_path):
    a = Plan(quant=("rtn:4",), name="a")
    b = Plan(quant=("rtn:3",), name="b")
    path = tmp_path / "r.sqlite"
    with Store(path) as st:
        st.bind(a, "h")
        st.write(ProbeRow("x", "loss", "", metrics=[metric("loss", 1.0)]))
    with Store(path) as st:
        st.bind(a.replace(name="renamed"), "h")  # same plan, other name: fine
        with pytest.raises(StoreError, match="different plan.*allow_mixed=True"):
            st.bind(b, "h")
        with pytest.raises(StoreError, match="other data"):
            st.bind(a, "h2")
        st.bind(b, "h", allow_mixed=True)
        assert st.meta["plan_hashes"] == [a.hash, b.hash]


def test_store_rejects_non_sqlite(tmp_path):
    p = tmp_path / "x.sqlite"
    p.write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match="not a losslens results store"):
        Store(p)


def test_one_store_holds_several_runs_with_the_same_labels(tmp_path):
    plan = Plan(quant=("rtn:4",))
    tasks = plan.tasks()
    with Store(tmp_path / "r.sqlite") as st:
        for run, loss in (("wsd", 1.0), ("cosine", 2.0)):
            st.bind(plan.replace(name=run), "h")
            st.add_checkpoints([Ref("step-1", 1, 1, 0.1 * loss)], run=run)
            assert [t.key for t in st.pending("step-1", tasks, "h", run=run)] == [t.key for t in tasks]
            st.write(
                ProbeRow("step-1", "loss", "", metrics=[metric("loss", loss)], config_hash=tasks[0].config_hash),
                data_hash="h",
                run=run,
            )
        assert st.runs() == ["wsd", "cosine"]
        assert [t.probe for t in st.pending("step-1", tasks, "h", run="wsd")] == ["quant"]
        df = st.results()
    got = {r.run: (r.value, r.lr) for r in df.itertuples()}
    assert got == {"wsd": (1.0, pytest.approx(0.1)), "cosine": (2.0, pytest.approx(0.2))}


def test_a_second_trajectory_under_one_run_name_is_refused(tmp_path):
    """Issue #47: forks of one base share labels (step-000000 in each). Sweeping a second fork into a
    store under the first one's run name used to keep the first fork's rows as its numbers (they were
    'done'); the store refuses and names the fix. A trajectory that moved (its old folder gone) resumes."""
    plan = Plan(quant=("rtn:4",))
    a, b = tmp_path / "a" / "step-0", tmp_path / "b" / "step-0"
    a.mkdir(parents=True), b.mkdir(parents=True)
    with Store(tmp_path / "r.sqlite") as st:
        st.bind(plan, "h")
        st.add_checkpoints([Ref("step-0", 0, 0, 1e-3, location=str(a))])
        st.add_checkpoints([Ref("step-0", 0, 0, 1e-3, location=str(a))])  # the same one again: fine
        with pytest.raises(StoreError, match=r"holds checkpoint step-0 from .*a/step-0, not .*b/step-0.*--run NAME"):
            st.add_checkpoints([Ref("step-0", 0, 0, 1e-3, location=str(b))])
        st.add_checkpoints([Ref("step-0", 0, 0, 1e-3, location=str(b))], run="b")  # its own run: fine
        a.rmdir()
        moved = tmp_path / "moved" / "step-0"
        st.add_checkpoints([Ref("step-0", 0, 0, 1e-3, location=str(moved))])  # a moved: resumes
        assert set(st.checkpoints()["location"]) == {str(moved), str(b)}


def test_a_calibration_set_too_short_for_gptq_gets_more_batches(tmp_path):
    from losslens.lm.checkpoints import Trajectory
    from losslens.study.sweep.datasets import _calibration_for, _first_config, _widest_input
    from losslens.study.sweep.testing import tiny_trajectory

    assert _calibration_for((2, 4, 64), 3072) == (12, 4, 64)  # Pythia-160m's MLP: 3,072 inputs
    assert _calibration_for((12, 4, 64), 3072) == (12, 4, 64)  # already enough: unchanged
    assert _calibration_for((2, 4, 64), None) == (2, 4, 64)
    traj = Trajectory.from_folder(tiny_trajectory(tmp_path / "t", n=1))
    assert _widest_input(_first_config(traj)) == 64  # hidden 32, MLP 64
    with pytest.warns(UserWarning, match="fewer than the widest quantized layer"):
        assert _calibration_for((1, 1, 32), _widest_input(_first_config(traj))) == (2, 1, 32)
