"""Task accuracy through lm-evaluation-harness (losslens.measure.accuracy, issue #28).

The independent check: lm-eval's per-item log-likelihoods (log_samples) equal the ones the
project's own ``lm_loss`` gives on the same tokens, for an FP and a quantized model. ``lm_loss`` is
a mean over all next-token targets of a sequence, so the continuation's log-likelihood is
``-( (|ctx+cont|-1)·lm_loss(ctx+cont) − (|ctx|-1)·lm_loss(ctx) )`` (causal: the context's targets
are scored identically in both), a code path that shares nothing with lm-eval's.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("lm_eval")

from losslens.measure.accuracy import (
    TASK_NAME,
    AccuracyError,
    TaskUnavailable,
    build_items,
    embedded_items,
    export_task,
    length_baselines,
    mcnemar_p,
    paired_delta,
    prepare_tasks,
    score_model,
    select_tasks,
    subsample,
    task_accuracy,
)
from losslens.measure.accuracy.embedded import CONTEXT_TOKENS, reference_tokenizer
from losslens.lm.core.next_token_loss import lm_loss
from losslens.lm.data import embedded_documents, is_heldout, train_bpe_tokenizer
from losslens.lm.models.families import tiny_model


@pytest.fixture(scope="module")
def tok():
    return reference_tokenizer()


@pytest.fixture(scope="module")
def items():
    return embedded_items()


def _model(seed=0, dtype=torch.float32, family="gpt_neox"):
    return tiny_model(family, seed=seed, dtype=dtype, vocab_size=384, max_position_embeddings=64)


# ----------------------------------------------------------------------------- the embedded task
def test_embedded_task_is_well_formed(items, tok):
    assert len(items) > 1000
    prompts = [it["prompt"] for it in items]
    assert len(set(prompts)) == len(prompts)  # no duplicate item
    assert len({(it["prompt"], tuple(it["choices"])) for it in items}) == len(items)
    corpus = json.loads(items[0]["corpus"])
    assert corpus["python"] and corpus["split"] == "heldout" and len(corpus["sha256"]) == 64
    for it in items:
        assert len(it["choices"]) == 4 and len(set(it["choices"])) == 4  # 4 distinct options
        assert isinstance(it["gold"], int) and 0 <= it["gold"] < 4  # exactly one gold
        assert is_heldout(it["doc"])  # held-out documents only
        assert not it["prompt"].endswith(" ") and all(c.startswith(" ") for c in it["choices"])
        # within the context: prompt + longest choice, encoded together as lm-eval does
        assert max(len(tok.encode(it["prompt"] + c)) for c in it["choices"]) <= CONTEXT_TOKENS
    golds = np.bincount([it["gold"] for it in items], minlength=4) / len(items)
    assert np.all(np.abs(golds - 0.25) < 0.05)


def test_embedded_task_is_deterministic_and_fits_larger_vocabularies(items, tok):
    fresh = build_items(tokenizer=tok)  # rebuilt from the corpus, not the disk cache
    assert fresh == items
    train = [t for _, t in embedded_documents(True, "train")]
    bpe512 = train_bpe_tokenizer(train, 512)  # the demo's vocabulary: never more tokens
    for it in items[::7]:
        for c in it["choices"]:
            assert len(bpe512.encode(it["prompt"] + c)) <= len(tok.encode(it["prompt"] + c))


def test_length_only_baselines_score_near_chance(items):
    b = length_baselines(items)
    se = (0.25 * 0.75 / b["n"]) ** 0.5
    assert abs(b["longest"] - 0.25) < 3 * se and abs(b["shortest"] - 0.25) < 3 * se


# ----------------------------------------------------------------------------- the independent check
def _lm_loss_loglik(model, tok, context: str, continuation: str) -> float:
    """log p(continuation | context) from the project's lm_loss, on lm-eval's token split."""
    ctx = tok.encode(context)
    whole = tok.encode(context + continuation)
    seq = ctx + whole[len(ctx) :]
    with torch.no_grad():
        full = float(lm_loss(model, torch.tensor([seq]))) * (len(seq) - 1)
        head = float(lm_loss(model, torch.tensor([ctx]))) * (len(ctx) - 1) if len(ctx) > 1 else 0.0
    return -(full - head)


@pytest.mark.parametrize(
    "dtype,family,spec",
    [
        (torch.float64, "gpt_neox", None),
        (torch.float64, "gpt_neox", "rtn:2:g32"),
        (torch.float32, "llama", None),
        (torch.float32, "gpt_neox", "rtn:3:row"),
    ],
)
def test_lm_eval_logliks_equal_lm_loss(tok, dtype, family, spec):
    from losslens.lm.quant import quantize

    model = _model(seed=1, dtype=dtype, family=family)
    if spec is not None:
        model = quantize(model, spec).model
    prep = prepare_tasks(select_tasks("embedded"), limit=24, seed=3)
    score = score_model(model, tok, prep, batch_size=16, limit=24, seed=3, keep_samples=True)[TASK_NAME]
    assert score.n == 24 and len(score.loglik) == 24 and score.n_truncated == 0
    worst = 0.0
    for lls, args in zip(score.loglik, score.arguments):
        assert len(lls) == 4
        for ll, (context, continuation) in zip(lls, args):
            ref = _lm_loss_loglik(model, tok, context, continuation)
            # float64: absolute 1e-5 (measured ~1e-12); float32: relative 1e-5 (the lm_loss route
            # subtracts two sums of ~30-60 nats, each rounded at ~4e-6 relative)
            worst = max(worst, abs(ll - ref) / (1.0 if dtype == torch.float64 else max(1.0, abs(ref))))
    assert worst <= 1e-5, worst
    # the outcome lm-eval reports is the argmax of those log-likelihoods
    gold = [int(k.split(":")[1]) for k in score.items]
    golds = [embedded_items()[g]["gold"] for g in gold]
    assert np.array_equal(
        score.correct, np.array([int(np.argmax(loglik)) == g for loglik, g in zip(score.loglik, golds)])
    )


# ----------------------------------------------------------------------------- statistics
def test_paired_delta_matches_direct_computation():
    rng = np.random.default_rng(0)
    fp = rng.random(300) < 0.6
    q = fp.copy()
    flip = rng.choice(300, 40, replace=False)
    q[flip] = ~q[flip]
    d = paired_delta(fp, q, n_boot=2000, seed=1)
    assert d.delta == pytest.approx(q.mean() - fp.mean(), abs=1e-12)
    assert d.rel_drop == pytest.approx((fp.mean() - q.mean()) / fp.mean(), abs=1e-12)
    assert d.b == int(np.sum(fp & ~q)) and d.c == int(np.sum(~fp & q)) and d.b + d.c == 40
    assert d.ci_low <= d.delta <= d.ci_high
    # paired: only the 40 discordant items vary, so the interval is far narrower than an unpaired one
    unpaired_se = (fp.var(ddof=1) / 300 + q.var(ddof=1) / 300) ** 0.5
    assert d.stderr < 0.6 * unpaired_se
    assert d.stderr == pytest.approx((40 / 300) ** 0.5 / 300**0.5, rel=0.15)  # √(discordant share / n)
    same = paired_delta(fp, fp, n_boot=200)
    assert same.delta == 0 and same.ci_low == 0 and same.ci_high == 0 and same.p == 1.0


def test_mcnemar_exact_values():
    fp = np.array([1] * 10 + [0] * 2 + [1] * 5, bool)
    q = np.array([0] * 10 + [1] * 2 + [1] * 5, bool)  # b = 10, c = 2
    from math import comb

    p = 2 * sum(comb(12, k) for k in range(3)) / 2**12
    assert mcnemar_p(fp, q) == pytest.approx(p, rel=1e-12)


def test_paired_delta_of_a_mean_over_tasks():
    rng = np.random.default_rng(2)
    fps = [rng.random(n) < 0.5 for n in (50, 400)]
    qs = [f ^ (rng.random(f.size) < 0.1) for f in fps]
    d = paired_delta(fps, qs, n_boot=500, seed=0)
    want = np.mean([q.mean() - f.mean() for f, q in zip(fps, qs)])  # each task weighs the same
    assert d.delta == pytest.approx(want, abs=1e-12) and d.p is None and d.n == 450
    with pytest.raises(ValueError):
        paired_delta(fps[0], qs[1])


# ----------------------------------------------------------------------------- tasks, subsamples, offline
def test_subsample_is_seeded_random_and_recorded():
    a = subsample(1000, 50, 0, "t")
    assert a == subsample(1000, 50, 0, "t") and a != subsample(1000, 50, 1, "t") and a != list(range(50))
    assert a == sorted(set(a)) and len(a) == 50 and subsample(40, 50, 0, "t") is None


def test_report_pairs_fp_and_quantized_on_the_same_items(tok):
    rep = task_accuracy(_model(seed=2), tok, "embedded", specs=["rtn:2:g32"], limit=30, seed=5, n_boot=200)
    fp, q = rep.scores["fp"][TASK_NAME], rep.scores["rtn:2:g32"][TASK_NAME]
    assert fp.items == q.items and fp.n == 30 and fp.limit == 30
    assert fp.doc_ids[TASK_NAME] == subsample(len(embedded_items()), 30, 5, TASK_NAME)
    assert fp.acc == pytest.approx(fp.correct.mean()) and fp.acc_norm is not None
    recs = {(r["variant"], r["task"]): r for r in rep.records()}
    d = recs[("rtn:2:g32", "mean")]
    assert d["delta_acc"] == pytest.approx(q.acc - fp.acc) and d["n"] == 30


def test_local_yaml_file_and_folder_give_the_embedded_scores(tmp_path, tok):
    sub = embedded_items()[:25]
    yaml_path = export_task(tmp_path / "frozen", items=sub)
    model = _model(seed=4)
    a = task_accuracy(model, tok, [str(yaml_path)], n_boot=0).scores["fp"]
    b = task_accuracy(model, tok, [str(tmp_path / "frozen")], n_boot=0).scores["fp"]
    name = "losslens_pydoc_mc_frozen"
    emb = task_accuracy(model, tok, "embedded", limit=None, n_boot=0, specs=()).scores["fp"][TASK_NAME]
    assert a[name].n == 25 and np.array_equal(a[name].correct, b[name].correct)
    assert np.array_equal(a[name].correct, emb.correct[:25])


def test_uncached_task_fails_with_a_one_line_hint(tmp_path, monkeypatch, tok):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "empty-cache"))
    y = tmp_path / "remote.yaml"
    y.write_text(
        "task: remote_never_cached\ndataset_path: losslens-test/never-cached-xyz\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: q\ndoc_to_choice: ['a', 'b']\ndoc_to_target: 0\n"
    )
    rep = task_accuracy(_model(), tok, [str(y), "embedded"], limit=5, n_boot=0)
    err = rep.scores["fp"]["remote_never_cached"]
    assert isinstance(err, TaskUnavailable)
    msg = str(err)
    assert "\n" not in msg and "HF_DATASETS_OFFLINE=1" in msg and "cache it once while online" in msg
    assert rep.scores["fp"][TASK_NAME].n == 5  # the other task still ran


def test_items_beyond_the_context_are_counted(tok):
    model = tiny_model("gpt_neox", vocab_size=384, max_position_embeddings=24)  # far below the task's 64 tokens
    score = score_model(model, tok, prepare_tasks(select_tasks("embedded"), limit=10), limit=10)[TASK_NAME]
    assert score.n_truncated == 10


def test_bad_task_arguments_raise_specific_errors(tmp_path):
    with pytest.raises(AccuracyError, match="no task given"):
        select_tasks([])
    with pytest.raises(AccuracyError, match="does not exist"):
        select_tasks([str(tmp_path / "missing.yaml")])
    sel = select_tasks("seed-12")
    assert len(sel.names) == 12 and "mmlu" in sel.names and dict(sel.fewshot)["mmlu"] == 5 and sel.needs_defaults
