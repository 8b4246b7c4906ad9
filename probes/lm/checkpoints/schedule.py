"""Learning rate and tokens per checkpoint from a trajectory's published schedule.

A hub revision (Pythia ``step1000``) carries its step but neither its learning rate nor the tokens
seen. A :class:`Schedule` derives both from the step: ``lr(step)`` with the base schedules of
:mod:`losslens.lm.core.base_schedules`, ``tokens(step) = step * tokens_per_step``. It is written as a spec
string (``--schedule`` on the command line, the ``"schedule"`` key of a ``trajectory.json``)::

    cosine:peak=6e-4,warmup=1430,total=143000,final=0.1   half cosine to 10% of the peak at step 143000
    wsd:peak=3e-3,warmup=40,total=800,decay=160           warmup, stable, linear decay over the last 160 steps
    linear:peak=1e-3,total=10000                          straight line to 0 at step 10000
    constant:peak=1e-3,warmup=100
    pythia-160m                                           a preset (:data:`PRESETS`)

Keys (steps are optimizer updates; LRs as given to the optimizer):

- ``peak`` -- the LR after the warmup (required);
- ``warmup`` -- updates of linear warmup from 0 (default 0);
- ``total`` -- the step at which the decay ends (cosine, linear, wsd; required there);
- ``final`` -- the LR at ``total`` as a fraction of ``peak`` (default 0);
- ``decay`` -- wsd: updates of the linear decay that ends at ``total`` (required there);
- ``floor`` -- after the warmup the LR is never below ``floor * peak`` (default 0);
- ``lag`` -- the update that produced step ``s`` used the schedule's value at ``s - lag`` (default 0,
  the convention of :mod:`losslens.lm.core.base_schedules`; GPT-NeoX / Megatron step their scheduler after
  each update: 1);
- ``tokens`` -- tokens per optimizer update (optional; ``--tokens-per-step`` overrides it).

Past ``total`` a schedule would hold its final value; a checkpoint past ``total`` is refused as a
likely typo. :func:`apply_schedule` writes the values into checkpoint references and records where
they came from (``meta["lr_source"]``, ``meta["tokens_source"]``); stores, correlations
(``--control lr``) and the phase detector then read them like recorded values.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from losslens.lm.core.base_schedules import constant_lr, cosine_lr, linear_lr, wsd_lr

from losslens.lm.checkpoints.errors import ScheduleError
from losslens.lm.checkpoints.refs import CheckpointRef

__all__ = [
    "Schedule",
    "PRESETS",
    "FAMILIES",
    "parse_schedule",
    "as_schedule",
    "apply_schedule",
    "read_sidecar",
    "check_tokens_per_step",
]

FAMILIES = ("cosine", "wsd", "linear", "constant")
_KEYS = {  # the keys each family takes; every family also takes lag and tokens
    "constant": ("peak", "warmup"),
    "cosine": ("peak", "warmup", "total", "final", "floor"),
    "linear": ("peak", "warmup", "total", "final", "floor"),
    "wsd": ("peak", "warmup", "total", "decay", "final", "floor"),
}
_INT_KEYS = ("warmup", "total", "decay", "lag", "tokens")


@dataclass(frozen=True)
class Schedule:
    """A learning-rate schedule over optimizer steps, plus tokens per step (see the module docstring).

    ``lr(step)``: the LR of the update that produced checkpoint ``step`` (float). ``tokens(step)``:
    ``step * tokens_per_step`` (None when unknown). ``spec``: the canonical spec string (every
    value explicit), which :func:`parse_schedule` reads back to an equal schedule. Cost: O(1) per step.
    """

    family: str
    peak: float
    warmup: int = 0
    total: int | None = None
    final: float = 0.0
    decay: int | None = None
    floor: float = 0.0
    lag: int = 0
    tokens_per_step: int | None = None
    name: str | None = field(default=None, compare=False)

    def lr(self, step: int) -> float:
        s = max(0, int(step) - self.lag)
        low = self.final * self.peak
        if self.family == "constant":
            v = constant_lr(s, self.peak, self.warmup)
        elif self.family == "cosine":
            v = cosine_lr(s, self.total, self.peak, low, self.warmup)
        elif self.family == "linear":
            v = linear_lr(s, self.total, self.peak, low, self.warmup)
        else:
            v = wsd_lr(s, self.total, self.peak, low, self.warmup, self.decay or 0)
        if self.floor and s > self.warmup:
            v = max(v, self.floor * self.peak)
        return float(v)

    def tokens(self, step: int) -> int | None:
        return None if self.tokens_per_step is None else int(step) * self.tokens_per_step

    @property
    def spec(self) -> str:
        parts = [f"peak={self.peak!r}"]
        for key in ("warmup", "total", "decay", "final", "floor", "lag"):
            v = getattr(self, key)
            if v not in (None, 0, 0.0) or (key == "decay" and v is not None):
                parts.append(f"{key}={v!r}")
        if self.tokens_per_step is not None:
            parts.append(f"tokens={self.tokens_per_step}")
        return f"{self.family}:{','.join(parts)}"

    def __str__(self) -> str:
        return self.name or self.spec


# ------------------------------------------------------------------------------------------ presets
_PYTHIA_STEPS = 143_000
_PYTHIA_WARMUP = 1430  # "warmup": 0.01 of "lr-decay-iters": 143000
_PYTHIA_TOKENS = 1024 * 2048  # 2,097,152 tokens per step: 1024 sequences of 2048 tokens
_PYTHIA_PEAK = {
    "14m": 1.0e-3,
    "31m": 1.0e-3,
    "70m": 1.0e-3,
    "160m": 6.0e-4,
    "410m": 3.0e-4,
    "1.4b": 2.0e-4,
    "2.8b": 1.6e-4,
    "6.9b": 1.2e-4,
    "12b": 1.2e-4,
}
_PYTHIA_DEDUPED = ("70m", "160m", "410m", "1.4b", "2.8b", "6.9b", "12b")


def _pythia(size: str, name: str) -> Schedule:
    return Schedule(
        "cosine",
        _PYTHIA_PEAK[size],
        warmup=_PYTHIA_WARMUP,
        total=_PYTHIA_WARMUP + _PYTHIA_STEPS,
        final=0.0,
        floor=0.1,
        lag=1,
        tokens_per_step=_PYTHIA_TOKENS,
        name=name,
    )


PRESETS: dict[str, Schedule] = {
    **{f"pythia-{s}": _pythia(s, f"pythia-{s}") for s in _PYTHIA_PEAK},
    **{f"pythia-{s}-deduped": _pythia(s, f"pythia-{s}-deduped") for s in _PYTHIA_DEDUPED},
}
"""Published schedules, by name. Only runs whose schedule can be sourced:

**Pythia** (Biderman et al. 2023, arXiv:2304.01373). Sources: EleutherAI/pythia
``models/<size>/pythia-<size>.yml`` and its README's model table. Every size: 143,000 steps of
1024 × 2048 = 2,097,152 tokens (299,892,736,000 tokens at ``step143000``), ``"lr-decay-style":
"cosine"``, ``"warmup": 0.01``, ``"train-iters" = "lr-decay-iters" = 143000``, ``min_lr`` = 0.1 × peak.
Peak LR (config ``optimizer.params.lr``, equal to the README table): 14m, 31m, 70m 1.0e-3; 160m
6.0e-4; 410m 3.0e-4; 1.4b 2.0e-4; 2.8b 1.6e-4; 6.9b and 12b 1.2e-4; the ``-deduped`` configs hold the
same values. The README reproduces training with GPT-NeoX v1.0; its ``megatron/learning_rates.py``
(``AnnealingLR``, unchanged from February 2022 until the August 2023 fixes #1008 and #1011, so the
code Pythia trained with) computes, after ``n`` scheduler steps: ``peak * n / 1430`` for
``n <= 1430``, then ``max(min_lr, peak / 2 * (1 + cos(pi * (n - 1430) / 143000)))`` -- a cosine to
*zero* over 143,000 steps after the warmup, floored at 10% of the peak (reached near step 115,140),
not a cosine that ends at 10%. DeepSpeed steps the scheduler after each update, so the update that
produced step ``s`` used ``n = s - 1``. Here:
``cosine:peak=P,warmup=1430,total=144430,floor=0.1,lag=1,tokens=2097152``.
The reading "cosine to 10% at step 143,000" (``cosine:peak=P,warmup=1430,total=143000,final=0.1``,
e.g. the "When Flat Minima Fail" study's 45% of the peak at step 82,000) differs from the code by up
to 0.09 × peak: at step 82,000 the code gives 40.1% of the peak, at 100,000 22.0% (29.0%), from
step ~115,140 on 10% (18.3% there). Caveat: DeepSpeed does not step the scheduler on an update
skipped for fp16 overflow, so a checkpoint's true LR lags this by the (unpublished) number of
skipped updates; only the warmup checkpoints (steps 1-1430) are sensitive to a few steps.

Not a preset: **pythia-1b** -- its config says 2.5e-4 but the README table says 3.0e-4; give
``--schedule cosine:peak=...,warmup=1430,total=144430,floor=0.1,lag=1,tokens=2097152`` with the
value you trust. Other families (OLMo, SmolLM3, ...) only when their schedule is sourced: write
their spec yourself.
"""

_NOT_PRESETS = {
    "pythia-1b": "its peak LR is not settled by the sources (config models/1B/pythia-1b.yml: 2.5e-4; README "
    "table: 3.0e-4)",
}
_NOT_PRESETS["pythia-1b-deduped"] = _NOT_PRESETS["pythia-1b"]


# ------------------------------------------------------------------------------------------ parsing
def _number(key: str, text: str, spec: str) -> float | int:
    try:
        v = float(text)
    except ValueError:
        raise ScheduleError(f"schedule {spec!r}: {key}={text!r} is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise ScheduleError(f"schedule {spec!r}: {key} must be a finite number >= 0, got {text}")
    if key in _INT_KEYS:
        if v != int(v):
            raise ScheduleError(
                f"schedule {spec!r}: {key} is a count of optimizer steps (tokens: per step) and must "
                f"be a whole number, got {text}"
            )
        return int(v)
    return v


def _help() -> str:
    return (
        f"write FAMILY:key=value,... with FAMILY one of {', '.join(FAMILIES)} (e.g. "
        "cosine:peak=6e-4,warmup=1430,total=143000,final=0.1), or a preset: "
        f"{', '.join(p for p in PRESETS if not p.endswith('-deduped'))} (and their -deduped runs)"
    )


def parse_schedule(spec: str) -> Schedule:
    """A :class:`Schedule` from a spec string or a preset name (see the module docstring).

    Raises :class:`ScheduleError` naming the problem (unknown family, preset or key, a missing or
    out-of-range value)."""
    text = str(spec).strip()
    if text in PRESETS:
        return PRESETS[text]
    if text in _NOT_PRESETS:
        raise ScheduleError(
            f"{text!r} is not a preset: {_NOT_PRESETS[text]}. Give the schedule yourself, e.g. "
            "--schedule cosine:peak=3e-4,warmup=1430,total=144430,floor=0.1,lag=1,tokens=2097152 "
            "(the Pythia form, see losslens.lm.checkpoints.schedule.PRESETS)"
        )
    family, colon, body = text.partition(":")
    family = family.strip().lower()
    if family not in FAMILIES or not colon:
        raise ScheduleError(f"unknown schedule {text!r}: {_help()}")
    allowed = _KEYS[family] + ("lag", "tokens")
    values: dict[str, float | int] = {}
    for item in filter(None, (x.strip() for x in body.split(","))):
        key, eq, val = item.partition("=")
        key = key.strip().lower()
        if not eq or key not in allowed:
            raise ScheduleError(
                f"schedule {text!r}: {item!r} is not a key=value of a {family} schedule; keys: {', '.join(allowed)}"
            )
        if key in values:
            raise ScheduleError(f"schedule {text!r}: {key} is given twice")
        values[key] = _number(key, val.strip(), text)
    for need in ("peak",) + (("total",) if family != "constant" else ()) + (("decay",) if family == "wsd" else ()):
        if need not in values:
            raise ScheduleError(f"schedule {text!r}: a {family} schedule needs {need}=...; {_help()}")
    tokens = values.pop("tokens", None)
    sched = Schedule(
        family,
        **{k: (float(v) if k in ("peak", "final", "floor") else v) for k, v in values.items()},
        tokens_per_step=int(tokens) if tokens is not None else None,
    )
    _check(sched, text)
    return sched


def _check(s: Schedule, text: str) -> None:
    if s.peak <= 0:
        raise ScheduleError(f"schedule {text!r}: peak must be > 0")
    if s.total is not None and s.total <= s.warmup:
        raise ScheduleError(f"schedule {text!r}: total ({s.total}) must be larger than warmup ({s.warmup})")
    if s.decay is not None and s.total is not None and s.decay > s.total - s.warmup:
        raise ScheduleError(
            f"schedule {text!r}: decay ({s.decay}) cannot be longer than total - warmup ({s.total - s.warmup})"
        )
    for key in ("final", "floor"):
        if not 0.0 <= getattr(s, key) <= 1.0:
            raise ScheduleError(f"schedule {text!r}: {key} is a fraction of the peak in [0, 1], got {getattr(s, key)}")
    if s.tokens_per_step is not None and s.tokens_per_step < 1:
        raise ScheduleError(f"schedule {text!r}: tokens per step must be >= 1")


def as_schedule(schedule: "Schedule | str | None") -> Schedule | None:
    """``schedule`` as a :class:`Schedule` (a spec string or preset name is parsed; None stays None)."""
    if schedule is None or isinstance(schedule, Schedule):
        return schedule
    if isinstance(schedule, str):
        return parse_schedule(schedule)
    raise ScheduleError(f"a schedule is a spec string, a preset name or a Schedule, got {type(schedule).__name__}")


def check_tokens_per_step(value) -> int | None:
    """``value`` as a whole number of tokens per optimizer step >= 1 (None stays None), else :class:`ScheduleError`."""
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ScheduleError(f"tokens per step must be a whole number >= 1, got {value!r}") from None
    if not math.isfinite(v) or v < 1 or v != int(v):
        raise ScheduleError(f"tokens per step must be a whole number >= 1 (e.g. 2097152 = 1024 x 2048), got {value!r}")
    return int(v)


# ------------------------------------------------------------------------------------------ applying
def apply_schedule(
    refs: Iterable[CheckpointRef],
    schedule: "Schedule | str | None" = None,
    tokens_per_step: int | None = None,
    override: bool = True,
) -> list[CheckpointRef]:
    """``refs`` with ``lr`` from ``schedule`` and ``tokens`` from ``tokens_per_step`` (default: the
    schedule's own), for every ref with a step (derived ones included: their step is their last
    source's).

    ``override=True`` (given on the command line) replaces recorded values (the old LR is kept in
    ``meta["lr_recorded"]``); ``override=False`` (a ``trajectory.json`` sidecar) only fills values that
    are missing or were guessed from a name (``tokens4B``). Raises :class:`ScheduleError` for a
    checkpoint past the schedule's ``total``."""
    sched = as_schedule(schedule)
    tps = check_tokens_per_step(tokens_per_step)
    if tps is None and sched is not None:
        tps = sched.tokens_per_step
    out = []
    for r in refs:
        if r.step is None or (sched is None and tps is None):
            out.append(r)
            continue
        meta, changes = dict(r.meta), {}
        if sched is not None and (override or r.lr is None):
            if sched.total is not None and r.step > sched.total:
                raise ScheduleError(
                    f"checkpoint {r.label!r} is at step {r.step}, past the end of the schedule "
                    f"{sched} (total={sched.total}): check total= (steps are optimizer updates)"
                )
            changes["lr"] = sched.lr(r.step)
            if r.lr is not None and r.lr != changes["lr"]:
                meta["lr_recorded"] = r.lr
            meta["lr_source"] = f"schedule {sched.spec}" + (f" ({sched.name})" if sched.name else "")
        if tps is not None and (override or r.tokens is None or meta.get("tokens_source") == "name"):
            changes["tokens"] = r.step * tps
            meta["tokens_source"] = f"{tps} tokens per step"
        out.append(r.replace(meta=meta, **changes) if changes else r)
    return out


def read_sidecar(path: str | Path) -> tuple[Schedule | None, int | None]:
    """``(schedule, tokens_per_step)`` from the ``"schedule"`` and ``"tokens_per_step"`` keys of a
    ``trajectory.json`` (both None when the file or the keys are absent). Raises :class:`ScheduleError`
    naming the file when it is not JSON or a value is malformed."""
    p = Path(path)
    if not p.is_file():
        return None, None
    try:
        data = json.loads(p.read_text())
    except ValueError as exc:
        raise ScheduleError(f"{p} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        return None, None
    sched = data.get("schedule")
    if sched is not None and not isinstance(sched, str):
        raise ScheduleError(
            f'{p}: "schedule" must be a spec string or a preset name (e.g. "pythia-160m" or '
            f'"cosine:peak=6e-4,warmup=1430,total=143000,final=0.1"), got {sched!r}'
        )
    try:
        return as_schedule(sched), check_tokens_per_step(data.get("tokens_per_step"))
    except ScheduleError as exc:
        raise ScheduleError(f"{p}: {exc}") from exc
