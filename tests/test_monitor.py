"""The robustness monitor (losslens.study.monitor, issue #29): training continues bit-identically with it
(a real transformers.Trainer, Lightning, the plain loop), its rows are a sweep store's, the memory
check refuses before training, the alarm fires once with a marker and a hook.

Models carry dropout, and the Trainer shuffles its data, so a measurement that consumed random
numbers without restoring them would change the training: the controls below show that it would.
"""

from __future__ import annotations

import contextlib
import math
import random
import warnings

import numpy as np
import pytest
import torch

from losslens.study.monitor import (
    Alarm,
    MonitorError,
    MonitorMemoryError,
    MonitorSettings,
    QuantizationAlarm,
    RobustnessMonitor,
    alarm_rate,
    preserved,
)
from losslens.study.sweep import Store

VOCAB, SEQ = 64, 16


def _model(seed: int = 0, dropout: float = 0.1):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=SEQ,
        hidden_dropout=dropout,
        attention_dropout=dropout,
        use_cache=False,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    return GPTNeoXForCausalLM(cfg)


def _tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(seed))


def _sets():
    return _tokens(8, 100).reshape(2, 4, SEQ), _tokens(4, 101).reshape(1, 4, SEQ)


def _monitor(path, **kw):
    ev, cv = _sets()
    kw.setdefault("time_budget", 1e9)
    kw.setdefault("trace_hvps", 4)
    kw.setdefault("lanczos_steps", 6)
    return RobustnessMonitor(path, ev, cv, **kw)


def _state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --------------------------------------------------------------------------- plain loop
def _plain_loop(steps: int, on_step=None, seed: int = 0):
    torch.manual_seed(seed)
    model = _model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = _tokens(64, 7)
    losses = []
    model.train()
    for step in range(1, steps + 1):
        idx = torch.randint(0, len(data), (4,))  # global RNG: would shift if the monitor drew numbers
        batch = data[idx]
        loss = model(input_ids=batch, labels=batch).loss  # dropout: global RNG again
        opt.zero_grad(set_to_none=False)  # grads kept (zeroed in place): the monitor must not touch them
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(model, step, lr=opt.param_groups[0]["lr"], loss=losses[-1])
    return _state(model), losses


def test_plain_loop_bit_identical_and_rows(tmp_path):
    ref_w, ref_l = _plain_loop(12)
    mon = _monitor(tmp_path / "m.sqlite", every=4, run="plain", tokens_per_step=4 * SEQ)
    w, losses = _plain_loop(12, mon.step)
    assert _same(w, ref_w) and losses == ref_l
    df = Store(tmp_path / "m.sqlite").results()
    assert sorted(df["step"].dropna().unique().tolist()) == [4, 8, 12]
    assert set(df["probe"]) == {"loss", "quant", "trace", "eigen"}
    assert set(df.loc[df["probe"] == "quant", "spec"]) == {"rtn:3:g128", "rtn:2:g32"}
    assert (df["status"] == "ok").all()
    assert df.loc[df["step"] == 8, "tokens"].iloc[0] == 8 * 4 * SEQ
    assert mon.n_measured == 3


def test_control_without_restoring_state_training_changes(tmp_path, monkeypatch):
    """The bit-identity test can fail: the same monitor with the state restoration switched off
    changes the training (its probes draw from the RNG, its evaluation flips the modes)."""
    import losslens.study.monitor.monitor as mm

    ref_w, _ = _plain_loop(8)

    @contextlib.contextmanager
    def nothing(model):
        torch.rand(1)  # what any seeded-by-global-RNG step inside would do
        model.eval()
        yield model

    monkeypatch.setattr(mm, "preserved", nothing)
    mon = _monitor(tmp_path / "m.sqlite", every=4)
    w, _ = _plain_loop(8, mon.step)
    assert not _same(w, ref_w)


def test_preserved_restores_rng_modes_grads():
    model = _model()
    model.train()
    model.gpt_neox.layers[0].eval()  # mixed modes survive
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    grads = [p.grad for p in model.parameters()]
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    expect = (random.random(), np.random.rand(), torch.rand(1))
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    with preserved(model):
        assert not model.training
        random.random(), np.random.rand(), torch.rand(3)
        for p in model.parameters():
            p.grad.mul_(0)  # in-place damage is undone too
            p.requires_grad_(False)
        next(model.parameters()).grad = None
    assert (random.random(), np.random.rand(), torch.rand(1)) == expect
    assert model.training and not model.gpt_neox.layers[0].training
    assert all(p.grad is g and torch.all(g == 1) and p.requires_grad for p, g in zip(model.parameters(), grads))


# --------------------------------------------------------------------------- transformers.Trainer
class _DS(torch.utils.data.Dataset):
    def __init__(self, tokens):
        self.t = tokens

    def __len__(self):
        return len(self.t)

    def __getitem__(self, i):
        return {"input_ids": self.t[i], "labels": self.t[i]}


def _trainer(tmp_path, callbacks=(), name="a", steps=20):
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp_path / name),
        max_steps=steps,
        per_device_train_batch_size=4,
        eval_strategy="steps",
        eval_steps=5,
        logging_steps=5,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        seed=0,
        learning_rate=3e-3,
        lr_scheduler_type="linear",
        warmup_steps=3,
        disable_tqdm=True,
        dataloader_num_workers=0,
        weight_decay=0.1,
    )
    torch.manual_seed(0)
    return Trainer(
        model=_model(0),
        args=args,
        train_dataset=_DS(_tokens(24, 7)),
        eval_dataset=_DS(_tokens(8, 8)),
        callbacks=list(callbacks),
    )


def _losses(trainer):
    return [
        (h["step"], h.get("loss"), h.get("eval_loss"))
        for h in trainer.state.log_history
        if "loss" in h or "eval_loss" in h
    ]


def test_hf_trainer_bit_identical_rows_lr_and_logs(tmp_path):
    pytest.importorskip("transformers")
    from losslens.study.monitor import RobustnessCallback

    ref = _trainer(tmp_path, name="ref")
    ref.train()
    ev, cv = _sets()
    cb = RobustnessCallback(tmp_path / "hf.sqlite", ev, cv, run="hf", time_budget=1e9, trace_hvps=4, lanczos_steps=6)
    tr = _trainer(tmp_path, name="mon")
    cb.attach(tr)
    tr.train()
    assert _same(_state(tr.model), _state(ref.model))
    assert _losses(tr) == _losses(ref)
    df = Store(tmp_path / "hf.sqlite").results()
    assert sorted(df["step"].dropna().unique().tolist()) == [5, 10, 15, 20]  # one per evaluation
    # the LR in effect for update t (linear warmup 3 steps to 3e-3, then linear decay to 0 at 20)
    for step in (5, 10, 15, 20):
        expect = 3e-3 * (20 - (step - 1)) / (20 - 3)
        assert df.loc[df["step"] == step, "lr"].iloc[0] == pytest.approx(expect, rel=1e-9)
    logged = [h for h in tr.state.log_history if "monitor/dq/rtn:2:g32" in h]
    assert [h["step"] for h in logged] == [5, 10, 15, 20]
    assert {"monitor/loss", "monitor/trace", "monitor/lambda_max", "monitor/below_floor"} <= set(logged[0])


def test_hf_without_trainer_handle_values_in_history_and_on_log(tmp_path):
    pytest.importorskip("transformers")
    from transformers import TrainerCallback

    from losslens.study.monitor import RobustnessCallback

    seen = []

    class Spy(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            seen.append(dict(logs))

    ev, cv = _sets()
    cb = RobustnessCallback(tmp_path / "hf.sqlite", ev, cv, run="hf", time_budget=1e9, curvature=False)
    tr = _trainer(tmp_path, callbacks=[cb, Spy()], steps=10)
    tr.train()
    assert [h["step"] for h in tr.state.log_history if "monitor/loss" in h] == [5, 10]
    assert any("monitor/dq/rtn:3:g128" in s for s in seen)


def test_hf_memory_refused_before_training(tmp_path):
    pytest.importorskip("transformers")
    from losslens.study.monitor import RobustnessCallback

    ev, cv = _sets()
    cb = RobustnessCallback(tmp_path / "hf.sqlite", ev, cv, max_memory=1000)
    tr = _trainer(tmp_path, callbacks=[cb], steps=5)
    before = _state(tr.model)
    with pytest.raises(MonitorMemoryError, match="before training|does not fit"):
        tr.train()
    assert tr.state.global_step == 0 and _same(_state(tr.model), before)


# --------------------------------------------------------------------------- Lightning
def _lightning_run(tmp_path, callbacks=(), name="a"):
    L = pytest.importorskip("lightning.pytorch")

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = _model(0)

        def training_step(self, batch, idx):
            loss = self.model(input_ids=batch, labels=batch).loss
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=3e-3)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / 20)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    L.seed_everything(0, verbose=False)
    module = Module()
    loader = torch.utils.data.DataLoader(_tokens(40, 7), batch_size=4, shuffle=True, generator=None)
    trainer = L.Trainer(
        max_steps=12,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
        accelerator="cpu",
        default_root_dir=str(tmp_path / name),
        log_every_n_steps=1,
    )
    trainer.fit(module, loader)
    return module, trainer


def test_lightning_bit_identical_and_logged(tmp_path):
    pytest.importorskip("lightning")
    from losslens.study.monitor import LightningRobustnessCallback

    ref, _ = _lightning_run(tmp_path, name="ref")
    ev, cv = _sets()
    cb = LightningRobustnessCallback(
        tmp_path / "pl.sqlite", ev, cv, every=4, run="pl", time_budget=1e9, trace_hvps=4, lanczos_steps=6
    )
    mod, trainer = _lightning_run(tmp_path, callbacks=[cb], name="mon")
    assert _same(_state(mod), _state(ref))
    df = Store(tmp_path / "pl.sqlite").results()
    assert sorted(df["step"].dropna().unique().tolist()) == [4, 8, 12]
    assert df.loc[df["step"] == 4, "lr"].iloc[0] == pytest.approx(3e-3 * (1 - 3 / 20))  # LR of update 4
    assert "monitor/dq/rtn:2:g32" in trainer.callback_metrics


# --------------------------------------------------------------------------- store, resume, report
def test_rows_are_a_sweep_store_resumable_and_reportable(tmp_path):
    from losslens.study.report.pages import build_report, load_store

    path = tmp_path / "m.sqlite"
    mon = _monitor(path, every=4, run="r")
    model = _model(0, dropout=0.0)
    first = mon.measure(model, 4, lr=1e-3)
    assert len(first.rows) == len(mon.tasks)
    mon.close()
    again = _monitor(path, every=4, run="r")  # a resumed run: step 4 is not recomputed
    m = again.measure(model, 4, lr=1e-3)
    assert m.rows == [] and m.values["loss"] == first.values["loss"]
    again.measure(model, 8, lr=1e-3)
    df, plan, _ = load_store(path)
    assert plan.trace.method == "hutchinson" and plan.eigen.method == "lanczos"
    assert build_report(df, tmp_path / "r.html").is_file()
    from typer.testing import CliRunner

    from losslens.cli.app import app

    again.measure(model, 12, lr=1e-3)
    r = CliRunner().invoke(app, ["report", str(path), "--out", str(tmp_path / "cli.html"), "--n-boot", "200"])
    assert r.exit_code == 0 and "3 checkpoints" in r.output, r.output
    meta = Store(path).meta
    assert meta["monitor:r"]["settings"]["trace_hvps"] == 4 and meta["monitor:r"]["memory"]["need"] > 0


def test_precision_floor_flags(tmp_path):
    mon = _monitor(tmp_path / "m.sqlite", trace_ci_floor=1e-9, lanczos_steps=2, lanczos_tol=1e-9)
    m = mon.measure(_model(0, dropout=0.0), 1)
    assert m.values["below_floor"] == 1.0
    rows = {r.probe: r for r in m.rows}
    assert rows["trace"].extra["below_floor"] and rows["eigen"].extra["below_floor"]
    assert rows["trace"].extra["rel_ci_half_width"] > 0


# --------------------------------------------------------------------------- alarm
def test_alarm_rate_definition():
    h = [(0, 4.0, 0.01), (50, 3.5, 0.02), (100, 3.4, 0.05)]
    rate, since = alarm_rate(h, window=50, min_improvement=0.01)
    assert since == 50 and rate == pytest.approx((0.05 - 0.02) / (3.5 - 3.4))
    assert alarm_rate(h, window=200, min_improvement=0.01) is None  # nothing that far back
    assert alarm_rate([(0, 3.4, 0.0), (50, 3.4, 0.1)], 50, 0.01) is None  # no loss improvement: undefined


def test_alarm_fires_once_with_marker_and_hook(tmp_path):
    events = []
    mon = _monitor(
        tmp_path / "m.sqlite", run="r", curvature=False, alarm_window=1, alarm_threshold=0.05, on_alarm=events.append
    )
    series = [(1, 4.0, 0.010), (2, 3.8, 0.012), (3, 3.7, 0.030), (4, 3.6, 0.060)]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for step, loss, dq in series:
            _, ev = mon.alarm.update(step, loss, dq)
            if ev is not None:
                mon._fire(ev)
    assert [e.step for e in events] == [3]
    assert sum(issubclass(x.category, QuantizationAlarm) for x in w) == 1
    assert Store(tmp_path / "m.sqlite").meta["monitor_alarm:r"]["step"] == 3
    resumed = _monitor(tmp_path / "m.sqlite", run="r", curvature=False)  # a resumed run does not warn again
    assert resumed.alarm.fired is not None and resumed.alarm.fired.step == 3


def test_alarm_replay_equals_live():
    a = Alarm("rtn:2:g32", threshold=0.1, window=2, min_improvement=0.01)
    rng = np.random.default_rng(0)
    hist = [
        (s, 4 - 0.01 * s, 0.001 * s + 0.0005 * s * (s > 30) ** 2 + 1e-4 * rng.standard_normal())
        for s in range(0, 60, 2)
    ]
    live = [a.update(*h)[1] for h in hist]
    fired = [e for e in live if e is not None]
    assert len(fired) == 1
    rates = [alarm_rate(hist[: i + 1], 2, 0.01) for i in range(len(hist))]
    first = next(i for i, r in enumerate(rates) if r is not None and r[0] > 0.1)
    assert fired[0].step == hist[first][0]


# --------------------------------------------------------------------------- settings
def test_bad_settings_raise_specific_errors(tmp_path):
    with pytest.raises(MonitorError, match="alarm_spec"):
        MonitorSettings(specs=("rtn:3",), alarm_spec="rtn:2:g32")
    with pytest.raises(MonitorError, match="trace_hvps"):
        MonitorSettings(trace_hvps=1)
    with pytest.raises(MonitorError, match="invalid quantizer spec|unknown"):
        MonitorSettings(specs=("nope:3",))
    with pytest.raises(MonitorError, match="calibration_set"):
        _monitor(tmp_path / "m.sqlite", specs=("gptq:3", "rtn:2:g32"))
    with pytest.raises(MonitorError, match="unknown monitor setting.*trace_probes"):
        _monitor(tmp_path / "m.sqlite", trace_probes=3)
    with pytest.raises(MonitorError, match="eval_set"):
        RobustnessMonitor(tmp_path / "m.sqlite", torch.zeros(2, 4, 8))
    assert math.isfinite(MonitorSettings().alarm_threshold)


# --------------------------------------------------------------------------- losslens train-tiny --monitor
def test_train_tiny_monitor_cli_same_checkpoints(tmp_path):
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from losslens.cli.app import app

    data = tmp_path / "data"
    base = ["train-tiny", "--tiny", "--steps", "20", "--checkpoints", "2", "-q", "--data-dir", str(data)]
    r = CliRunner().invoke(app, base + ["--out", str(tmp_path / "plain")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, base + ["--out", str(tmp_path / "mon"), "--monitor", "--monitor-every", "10"])
    assert r.exit_code == 0, r.output
    assert "monitor: " in r.output and "monitor.sqlite" in r.output
    for step in ("step-000010", "step-000020"):
        a = load_file(str(tmp_path / "plain" / step / "model.safetensors"))
        b = load_file(str(tmp_path / "mon" / step / "model.safetensors"))
        assert _same(a, b)
    df = Store(tmp_path / "mon" / "monitor.sqlite").results()
    assert 10 in set(df["step"].dropna()) and (df["status"] == "ok").all()
    r = CliRunner().invoke(app, base + ["--out", str(tmp_path / "x"), "--monitor", "--seeds", "0,1"])
    assert r.exit_code != 0 and "--monitor watches one run" in r.output


def test_time_budget_stretches_the_interval(tmp_path):
    """With a budget of ~0 every measurement after the first is skipped and counted; with a large
    one none is."""
    model = _model(0, dropout=0.0)
    tight = _monitor(tmp_path / "a.sqlite", every=1, time_budget=1e-9, curvature=False)
    got = [tight.step(model, s) for s in range(1, 5)]
    assert got[0] is not None and got[1:] == [None, None, None] and tight.n_skipped == 3
    assert Store(tmp_path / "a.sqlite").meta["monitor:monitor"]["skipped_for_time"] == 3
    assert Store(tmp_path / "a.sqlite").meta["monitor:monitor"]["skipped_steps"] == [2, 3, 4]  # for the report
    assert tight.summary()["skipped_steps"] == [2, 3, 4]
    loose = _monitor(tmp_path / "b.sqlite", every=2, curvature=False)
    assert [loose.step(model, s) is not None for s in range(1, 5)] == [False, True, False, True]


def test_alarm_waits_for_the_lr_to_anneal():
    """At peak LR a high rate does not fire (ΔQ growth there is ordinary progress); the first
    measurement over the threshold after the LR fell below (1 − lr_drop) × its peak does."""
    a = Alarm("rtn:2:g32", threshold=0.05, window=1, min_improvement=0.01, lr_drop=0.05)
    steps = [
        (1, 4.0, 0.01, 1e-3),
        (2, 3.9, 0.03, 1e-3),
        (3, 3.8, 0.05, 1e-3),
        (4, 3.7, 0.07, 0.96e-3),
        (5, 3.6, 0.09, 0.5e-3),
    ]
    fired = [a.update(*s)[1] for s in steps]
    assert [e.step for e in fired if e is not None] == [5]
    b = Alarm("rtn:2:g32", threshold=0.05, window=1, min_improvement=0.01)
    assert [e.step for e in (b.update(*s[:3])[1] for s in steps) if e is not None] == [2]  # no LR: rate alone
