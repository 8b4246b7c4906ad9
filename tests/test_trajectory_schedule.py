"""Schedules attached to trajectories (losslens.lm.checkpoints.schedule) and hub trajectory names (issue #17)."""

from __future__ import annotations

import math

import pytest

from losslens.lm.checkpoints import CheckpointRef, Trajectory, TrajectoryNameError, parse_hub_name
from losslens.lm.checkpoints.errors import NoCheckpointsError, ScheduleError
from losslens.lm.checkpoints.schedule import PRESETS, apply_schedule, parse_schedule


def neox_v1_lr(
    num_iters: float, start_lr: float, min_lr: float, warmup_iter: float = 0.01 * 143000, end_iter: int = 143000
) -> float:
    """GPT-NeoX v1.0 ``megatron/learning_rates.py`` ``AnnealingLR.get_lr`` (decay style cosine), transcribed."""
    num_iters_ = min(num_iters, end_iter - warmup_iter)
    if warmup_iter > 0 and num_iters <= warmup_iter:
        return float(start_lr) * num_iters_ / warmup_iter
    num_iters_ = num_iters_ - warmup_iter
    lr = start_lr / 2.0 * (math.cos(math.pi * num_iters_ / end_iter) + 1)
    return max(lr, min_lr)


PYTHIA_STEPS = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512] + list(range(1000, 143001, 1000))


@pytest.mark.parametrize("size,peak", [("160m", 6e-4), ("70m", 1e-3), ("1.4b", 2e-4), ("12b", 1.2e-4)])
def test_pythia_preset_is_gpt_neox_v1_cosine(size, peak):
    """Every published revision: the LR DeepSpeed had set for the update that produced it (scheduler at s - 1)."""
    sched = PRESETS[f"pythia-{size}"]
    assert PRESETS[f"pythia-{size}-deduped"] == sched and sched.peak == peak
    for s in PYTHIA_STEPS:
        assert sched.lr(s) == pytest.approx(neox_v1_lr(max(s - 1, 0), peak, 0.1 * peak), rel=1e-12, abs=0), s
    assert sched.tokens(143000) == 299_892_736_000  # "Each model saw 299,892,736,000 tokens" (Pythia README)
    assert sched.lr(100_000) > 0.2 * peak and sched.lr(120_000) == pytest.approx(0.1 * peak)  # floored, not decaying
    assert parse_schedule(sched.spec) == sched and str(sched) == f"pythia-{size}"


def test_unsourced_preset_is_refused_with_the_reason():
    with pytest.raises(ScheduleError, match=r"2\.5e-4.*3\.0e-4.*--schedule cosine:"):
        parse_schedule("pythia-1b")


def test_spec_strings_evaluate_and_round_trip():
    wsd = parse_schedule("wsd:peak=1,warmup=10,total=100,decay=20,final=0.1")
    assert [wsd.lr(s) for s in (5, 10, 50, 80, 90, 100)] == pytest.approx([0.5, 1, 1, 1, 0.55, 0.1])
    cos = parse_schedule(" Cosine:peak=6e-4, warmup=1430 ,total=143000,final=0.1,tokens=2097152")
    assert cos.lr(1430) == pytest.approx(6e-4) and cos.lr(143000) == pytest.approx(6e-5)
    mid = 1430 + (143000 - 1430) / 2
    assert cos.lr(int(mid)) == pytest.approx(6e-5 + 5.4e-4 / 2, rel=1e-4) and cos.tokens(10) == 20_971_520
    lin = parse_schedule("linear:peak=1e-3,total=1e4")
    assert lin.lr(2500) == pytest.approx(7.5e-4) and lin.tokens(5) is None
    const = parse_schedule("constant:peak=2e-3,warmup=4,lag=1")
    assert [const.lr(s) for s in (0, 1, 3, 5, 9)] == pytest.approx([0, 0, 1e-3, 2e-3, 2e-3])
    for s in (wsd, cos, lin, const):
        assert parse_schedule(s.spec) == s


@pytest.mark.parametrize(
    "spec,message",
    [
        ("cosin:peak=1", "unknown schedule"),
        ("cosine", "unknown schedule"),
        ("cosine:peak=1e-3", "needs total="),
        ("wsd:peak=1e-3,total=100", "needs decay="),
        ("cosine:peak=1e-3,total=100,decay=10", "'decay=10' is not a key=value of a cosine"),
        ("cosine:peak=1e-3,total=100,peak=2e-3", "given twice"),
        ("cosine:peak=1e-3,total=100,warmup=1.5", "whole number"),
        ("cosine:peak=abc,total=100", "not a number"),
        ("cosine:peak=1e-3,total=100,final=2", r"final is a fraction of the peak in \[0, 1\]"),
        ("cosine:peak=1e-3,total=100,warmup=100", "must be larger than warmup"),
        ("wsd:peak=1e-3,total=100,warmup=50,decay=60", "cannot be longer than total - warmup"),
        ("linear:peak=0,total=10", "peak must be > 0"),
        ("constant:peak=1e-3,total=10", "not a key=value of a constant"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec, message):
    with pytest.raises(ScheduleError, match=message):
        parse_schedule(spec)


def test_apply_schedule_override_fill_and_past_the_end():
    refs = [
        CheckpointRef("a", 100, lr=5e-4),
        CheckpointRef("b", 200),
        CheckpointRef("c", None),
        CheckpointRef("d", 300, tokens=999, meta={"tokens_source": "name"}),
    ]
    sched = parse_schedule("linear:peak=1e-3,total=400")
    filled = apply_schedule(refs, sched, tokens_per_step=10, override=False)
    assert [r.lr for r in filled] == [5e-4, pytest.approx(5e-4), None, pytest.approx(2.5e-4)]
    assert [r.tokens for r in filled] == [1000, 2000, None, 3000]  # a name's rounded tokens are replaced
    over = apply_schedule(refs, "constant:peak=1e-3", override=True)
    assert [r.lr for r in over] == [1e-3, 1e-3, None, 1e-3] and over[0].meta["lr_recorded"] == 5e-4
    assert over[3].tokens == 999  # no tokens per step given: tokens untouched
    with pytest.raises(ScheduleError, match="step 300, past the end of the schedule"):
        apply_schedule(refs, "cosine:peak=1e-3,total=250")
    with pytest.raises(ScheduleError, match="tokens per step must be a whole number"):
        apply_schedule(refs, None, tokens_per_step=0.5)
    traj = Trajectory(refs[:2], "t").with_schedule("pythia-160m")
    assert traj.meta["schedule"] == PRESETS["pythia-160m"].spec and traj.meta["tokens_per_step"] == 2_097_152
    assert traj.with_lawa(k=2)[-1].lr == traj[1].lr  # LAWA keeps its last source's derived LR


def test_hub_names():
    n = parse_hub_name("hf:EleutherAI/pythia-160m@step*")
    assert (n.repo_id, n.revisions) == ("EleutherAI/pythia-160m", ("step*",))
    assert parse_hub_name("hf:allenai/OLMo-2-0425-1B@stage1-step*").revisions == ("stage1-step*",)
    assert parse_hub_name("hf:org/x@step1000, step2000").revisions == ("step1000", "step2000")
    assert parse_hub_name("hf:org/x@re:step\\d{1,3}000").revisions == ("re:step\\d{1,3}000",)  # commas stay in a regex
    assert parse_hub_name("hf:gpt2").revisions == ("main",) and parse_hub_name("runs/wsd") is None
    for bad, msg in (
        ("hf:org/x@", "empty revision"),
        ("hf:org/x@a,,b", "empty revision"),
        ("hf:@step1", "not a hub repo"),
        ("hf:a/b/c@main", "not a hub repo"),
        ("hf:org/x@re:(", "not a valid regular expression"),
    ):
        with pytest.raises(TrajectoryNameError, match=msg):
            parse_hub_name(bad)


def test_from_hub_mixes_names_and_patterns():
    avail = ["main", "step1000", "step10000", "step2000", "stage1-step500-tokens2B"]
    t = Trajectory.from_hub("org/x", ["step2000", "step1*"], available=avail, local_files_only=True)
    assert t.labels == ["step1000", "step2000", "step10000"]  # a pattern among the items: ordered by step
    assert Trajectory.from_hub("org/x", ["step2000", "step9000"]).labels == ["step2000", "step9000"]  # names: as given
    olmo = Trajectory.from_hub("org/x", "stage1-*", available=avail)
    assert olmo[0].step == 500 and olmo[0].tokens == 2_000_000_000 and olmo[0].meta["tokens_source"] == "name"
    assert olmo.with_schedule(None, 3_000_000, override=False)[0].tokens == 1_500_000_000  # 500 x 3M, not the name's 2B
    with pytest.raises(NoCheckpointsError, match="matches 'step3\\*'.*hf download org/x --revision REV"):
        Trajectory.from_hub("org/x", ["step1*", "step3*"], available=avail)


def test_pythia_floor_is_not_an_end_value():
    """README: at step 82,000 the Pythia cosine (to zero, floored at 10%) is at 40% of the peak; a
    cosine that *ends* at 10% (same warm-up and lag) would give 46% there."""
    sched = PRESETS["pythia-160m"]
    assert sched.lr(82_000) / sched.peak == pytest.approx(0.40, abs=0.005)
    t = (82_000 - 1 - 1430) / 143_000  # the scheduler one step behind, after the warm-up (as the preset)
    assert 0.1 + 0.9 * (1 + math.cos(math.pi * t)) / 2 == pytest.approx(0.46, abs=0.005)
