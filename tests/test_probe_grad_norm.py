"""The ``grad_norm`` probe (‖∇L‖ and L on the curvature set), checked against a direct computation that
shares none of its code: the checkpoint loaded by transformers, all curvature batches in one forward,
the next-token cross-entropy written out in float64, the gradient by ``backward()``."""

from __future__ import annotations

import math

import pytest
import torch

from losslens.study.sweep import Plan, PlanError, Store, run_sweep
from losslens.study.sweep.testing import SEQ, tiny_token_sets, tiny_trajectory

QUANTIZED = "model.layers.*_proj.weight"


def test_plan_grad_norm_settings_tasks_and_hash():
    p = Plan.from_dict({"probes": {"grad_norm": True}})
    assert p.grad_norm is True and not p.loss
    assert [t.key for t in p.tasks()] == [("grad_norm", "")] and p.needs_curvature
    assert Plan.from_dict(p.to_dict()) == p and p.to_dict()["probes"] == {"grad_norm": True}
    # the row's settings follow the curvature space; a plan without the probe does not see it
    narrow = Plan(grad_norm=True, curvature_params=[QUANTIZED])
    assert narrow.tasks()[1].config_hash != Plan(grad_norm=True).tasks()[1].config_hash
    assert "grad_norm" not in Plan.default().to_dict()["probes"]
    with pytest.raises(PlanError, match="grad_norm must be true or false"):
        Plan.from_dict({"probes": {"grad_norm": 1}})


def _direct(checkpoint, batches, params: str | None) -> tuple[float, float]:
    """(L, ‖∇L‖₂) of the checkpoint on ``batches`` (equal shapes, so the token-weighted mean loss is
    the mean over all their tokens), w.r.t. the parameters whose names match ``params`` (all: None)."""
    from fnmatch import fnmatch

    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(checkpoint).eval()
    ids = torch.cat(list(batches))
    logits = model(input_ids=ids).logits.double()
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    nll = -logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    loss = nll.mean()
    loss.backward()
    chosen = [p.grad.double() for n, p in model.named_parameters() if params is None or fnmatch(n, params)]
    return float(loss.detach()), math.sqrt(sum(float((g * g).sum()) for g in chosen))


@pytest.mark.parametrize("params", [None, QUANTIZED])
def test_grad_norm_rows_equal_a_direct_computation(tmp_path, params):
    from losslens.lm.core.tokenset import TokenSet

    traj = tiny_trajectory(tmp_path / "t", n=2, seed=5)
    sets = tiny_token_sets(traj)
    g = torch.Generator().manual_seed(11)
    sets["curvature"] = TokenSet(torch.randint(0, 96, (2, 3, SEQ), generator=g), "curvature")  # two batches of 3
    data = {"eval": [2, 2, SEQ], "calibration": [2, 2, SEQ], "curvature": [2, 3, SEQ]}
    plan = Plan.from_dict(
        {"name": "g", "data": data, "probes": {"grad_norm": True}, **({"curvature_params": [params]} if params else {})}
    )
    out = tmp_path / "r.sqlite"
    rep = run_sweep(traj, plan, out=out, token_sets=sets, progress=False, num_threads=1, num_workers=1)
    assert rep.n_failed == 0, rep.failures
    with Store(out) as st:
        df = st.results()
    assert set(df["probe"]) == {"grad_norm"}
    for ck in ("step-000100", "step-000200"):
        rows = df[df.checkpoint == ck].set_index("metric")["value"]
        loss, norm = _direct(traj / ck, sets["curvature"], params)
        assert rows["loss"] == pytest.approx(loss, rel=1e-6)
        assert rows["grad_norm"] == pytest.approx(norm, rel=1e-5)
        assert norm > 0


def test_grad_norm_series_and_figure():
    import pandas as pd

    from losslens.study.analysis import series
    from losslens.study.report.figures import synthetic_results, trajectory_figures

    df = synthetic_results(n_checkpoints=4, lawa=False)
    extra = df[(df.probe == "loss") & (df.metric == "loss")]
    extra = extra.assign(probe="grad_norm", spec="", metric="grad_norm", value=[0.4, 0.3, 0.2, 0.1])
    df = pd.concat([df, extra], ignore_index=True)
    s = series(df, "grad_norm")
    assert list(s) == [0.4, 0.3, 0.2, 0.1]
    figs = trajectory_figures(df)
    assert list(figs)[:4] == ["loss", "quant", "grad_norm", "sharpness"]
    assert sum(len(t.y) for t in figs["grad_norm"].data if t.name == "grad_norm") == 4
