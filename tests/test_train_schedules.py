"""LR schedules as pure functions: base schedules (wsd / cosine / constant / linear) and fork
schedules (cosine continuation, SGDR warm restarts, oscillating lock-in) at known steps."""

from __future__ import annotations

import math

import pytest

from losslens.lm.train import schedules as S
from losslens.lm.train.config import TrainConfig, TrainError, lr_at
from losslens.lm.train.fork_schedule import ForkSchedule, lr_function


def test_base_schedules_at_known_steps():
    # warmup: 10 updates to 1e-2
    assert S.constant_lr(5, 1e-2, 10) == pytest.approx(5e-3)
    assert S.constant_lr(11, 1e-2, 10) == 1e-2 and S.constant_lr(1, 1e-2) == 1e-2
    # wsd: stable through step 80 of 100, then linear to 1e-3 at step 100
    assert S.wsd_lr(80, 100, 1e-2, 1e-3, 10, 20) == 1e-2
    assert S.wsd_lr(90, 100, 1e-2, 1e-3, 10, 20) == pytest.approx(5.5e-3)
    assert S.wsd_lr(100, 100, 1e-2, 1e-3, 10, 20) == pytest.approx(1e-3)
    assert S.wsd_lr(150, 100, 1e-2, 1e-3, 10, 20) == pytest.approx(1e-3)  # holds past the end
    # cosine / linear from the end of warmup (step 10) to step 110
    assert S.cosine_lr(60, 110, 1e-2, 0.0, 10) == pytest.approx(5e-3)
    assert S.cosine_lr(35, 110, 1e-2, 0.0, 10) == pytest.approx(1e-2 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert S.linear_lr(60, 110, 1e-2, 0.0, 10) == pytest.approx(5e-3)
    assert S.linear_lr(110, 110, 1e-2, 2e-3, 10) == pytest.approx(2e-3)


@pytest.mark.parametrize("schedule", ["wsd", "cosine", "constant", "linear"])
def test_lr_at_dispatches_to_the_pure_functions(schedule):
    cfg = TrainConfig(schedule=schedule, peak_lr=3e-3, steps=200, warmup=0.05, decay=0.25, min_lr_ratio=0.1)
    fn = {
        "wsd": lambda s: S.wsd_lr(s, 200, 3e-3, 3e-4, 10, 50),
        "cosine": lambda s: S.cosine_lr(s, 200, 3e-3, 3e-4, 10),
        "constant": lambda s: S.constant_lr(s, 3e-3, 10),
        "linear": lambda s: S.linear_lr(s, 200, 3e-3, 3e-4, 10),
    }
    assert all(lr_at(s, cfg) == pytest.approx(fn[schedule](s), rel=1e-12) for s in range(1, 201))
    assert lr_function({"config": cfg.to_dict()})(123) == lr_at(123, cfg)


def test_cosine_continuation_and_sgdr():
    f = S.cosine_continuation_lr
    assert f(0, 100, 4e-3, 1e-3) == pytest.approx(4e-3)
    assert f(50, 100, 4e-3, 1e-3) == pytest.approx(2.5e-3)
    assert f(100, 100, 4e-3, 1e-3) == pytest.approx(1e-3) and f(130, 100, 4e-3, 1e-3) == pytest.approx(1e-3)
    # SGDR, period 10: cycle ends at min, restarts right after
    assert S.sgdr_lr(5, 10, 1e-2) == pytest.approx(5e-3)
    assert S.sgdr_lr(10, 10, 1e-2, 1e-4) == pytest.approx(1e-4)
    assert S.sgdr_lr(11, 10, 1e-2) == pytest.approx(S.sgdr_lr(1, 10, 1e-2)) and S.sgdr_lr(11, 10, 1e-2) > 9.7e-3
    # period multiplier 2: cycles of 10, 20, 40 updates
    assert S.sgdr_cycle(10, 10, 2.0) == (0, 10, 10)
    assert S.sgdr_cycle(25, 10, 2.0) == (1, 15, 20)
    assert S.sgdr_cycle(31, 10, 2.0) == (2, 1, 40)
    assert S.sgdr_lr(20, 10, 1e-2, 0.0, 2.0) == pytest.approx(5e-3)  # middle of the 20-update cycle
    # one cycle as long as the fork, restarting at the start LR == the cosine continuation
    assert all(S.sgdr_lr(t, 50, 3e-3, 1e-4) == pytest.approx(f(t, 50, 3e-3, 1e-4)) for t in range(1, 51))
    with pytest.raises(ValueError):
        S.sgdr_cycle(3, 0)


def test_oscillate_phases_and_values():
    phases = [S.oscillate_phase(t, 2, 3) for t in range(1, 11)]
    assert phases == ["bump", "bump", "cool", "cool", "cool"] * 2  # each cycle ends on a cool update
    base = S.cosine_continuation_lr(1, 100, 2e-3, 0.0)
    assert S.oscillate_lr(1, 100, 2e-3, 0.0, 5e-4, 2, 3) == pytest.approx(base + 5e-4)
    assert S.oscillate_lr(3, 100, 2e-3, 0.0, 5e-4, 2, 3) == pytest.approx(S.cosine_continuation_lr(3, 100, 2e-3, 0.0))
    assert S.oscillate_phase(7, 0, 3) == "cool"  # no bumps at all


def test_fork_schedule_resolve_label_and_errors():
    parent = TrainConfig(peak_lr=1e-2, min_lr_ratio=0.1)
    cos = ForkSchedule("cosine", steps=40).resolve(parent, 4e-3)
    assert (cos.start_lr, cos.min_lr) == (4e-3, pytest.approx(1e-3)) and cos.label == "cosine"
    assert cos.lr(0) == pytest.approx(4e-3) and cos.lr(40) == pytest.approx(1e-3) and cos.phase(5) is None
    sg = ForkSchedule("sgdr", steps=30).resolve(parent, 4e-3)
    assert sg.period == 10 and sg.restart_lr == 1e-2 and sg.label == "sgdr-p10-r1e-2"
    assert sg.lr(1) == pytest.approx(S.sgdr_lr(1, 10, 1e-2, 1e-3))
    osc = ForkSchedule("oscillate", steps=30, bump_steps=2, cool_steps=8).resolve(parent, 4e-3)
    assert osc.amplitude == 4e-3 and osc.label == "oscillate-a4e-3-b2-c8"
    assert osc.phase(0) == "start" and osc.phase(2) == "bump" and osc.phase(3) == "cool"
    assert osc.lr(1) == pytest.approx(S.cosine_continuation_lr(1, 30, 4e-3, 1e-3) + 4e-3)
    par = ForkSchedule("parent", steps=5).resolve(parent, 4e-3)
    assert par.lr(2, parent_lr_fn=lambda s: s * 1e-4, fork_step=10) == pytest.approx(1.2e-3)
    assert ForkSchedule.from_dict(osc.to_dict()) == osc
    with pytest.raises(TrainError, match="unresolved|resolve"):
        ForkSchedule("cosine", steps=10).lr(1)
    with pytest.raises(TrainError, match="unknown fork schedule"):
        ForkSchedule("zigzag")
    with pytest.raises(TrainError, match="cool_steps"):
        ForkSchedule("oscillate", cool_steps=0)
    with pytest.raises(TrainError, match="steps"):
        ForkSchedule("cosine", steps=0)
