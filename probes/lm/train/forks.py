"""Schedule forks: continue a checkpoint of a ``train-tiny`` trajectory under a new LR schedule,
with several data-order seeds (seed 004, §5). Comparing forks by their quantization gap is
:mod:`losslens.lm.train.fork_compare`.

A fork of parent checkpoint ``step-S`` under :class:`ForkSchedule` ``sched`` with seed ``k`` is a
trajectory folder of its own::

    OUT/<kind>[-params]-at<S>-n<N>-s<k>/
        trajectory.json      # like train-tiny's, plus "fork": the lineage (below)
        validation.safetensors, tokenizer/
        step-<S>/            # the fork's step 0: the parent checkpoint, re-saved and re-evaluated
        step-<S + ...>/ ...  # checkpoints of the N fork updates (global step numbers)

- **Exact resumption.** The fork loads the parent checkpoint's weights *and* its AdamW state
  (``training_state.pt``, written when the parent ran with ``save_optimizer=True`` /
  ``--save-optimizer``); without that state a fork is refused unless ``restart_moments=True``,
  which restarts AdamW's moments from zero and says so in the lineage. The fork re-evaluates the
  parent's validation set at step ``S`` and records whether that loss equals the parent's
  (``fork.start_loss_matches``). Update ``S + t`` uses batch ``get_batch(stream, S + t)`` with
  data seed ``k``: seed ``k`` equal to the parent's data seed continues the parent's own data
  order, so the ``parent`` schedule with that seed reproduces the parent bit for bit.
- **Lineage** (``trajectory.json["fork"]``, also ``Trajectory.meta["fork"]``): parent folder and
  name, parent checkpoint label / step / LR / validation loss, the resolved schedule, its label and
  condition (name without the seed), the seed, how the optimizer state was obtained.
- **Phases**: every fork checkpoint record has ``phase``: ``"start"`` (the fork point), ``"bump"``
  or ``"cool"`` (oscillate), or ``None`` (schedules without bumps).

Units: steps are optimizer updates; LRs are AdamW learning rates; losses are mean next-token CE in
nats; the quantization gap is ``ppl_gap = exp(q_loss - fp_loss) - 1`` (a fraction, 0.05 = 5%).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import torch

from losslens.geometry.base.progress import ProgressArg
from losslens.lm.checkpoints import CheckpointLoader, CheckpointRef, Trajectory
from losslens.lm.core.next_token_loss import evaluate
from losslens.lm.core.threads import torch_threads

from losslens.lm.train.config import TrainConfig, TrainError, format_value
from losslens.lm.train.fork_schedule import ForkSchedule, lr_function
from losslens.lm.train.run_files import fork_start_entry, save_checkpoint, trajectory_record, write_json
from losslens.lm.train.tiny import build_model, build_optimizer, run_loop
from losslens.lm.train.tiny_data import prepare_data

__all__ = ["fork_trajectory", "fork_checkpoint_steps", "parent_checkpoint", "write_fork_index"]

FORKS_FORMAT = "losslens-forks/1"


# --------------------------------------------------------------------------------------------
# forking
# --------------------------------------------------------------------------------------------


def parent_checkpoint(traj: Trajectory, at: "str | int") -> CheckpointRef:
    """The checkpoint ``at`` of ``traj``: a label (``"step-000300"``), a step number (int or digit
    string), or ``"last"``; :class:`TrainError` listing what exists otherwise."""
    if isinstance(at, str) and at in ("last", "final"):
        return traj.real[-1]
    if isinstance(at, int) or (isinstance(at, str) and at.strip().isdigit()):
        step = int(at)
        for ref in traj.real:
            if ref.step == step:
                return ref
        raise TrainError(f"{traj.name} has no checkpoint at step {step}; it has steps {traj.steps}")
    try:
        return traj[at]
    except (KeyError, IndexError):
        raise TrainError(f"{traj.name} has no checkpoint {at!r}; it has {traj.labels}") from None


def fork_checkpoint_steps(
    fork_step: int, steps: int, checkpoints: int | None = None, every: int | None = None
) -> list[int]:
    """Global steps of a fork's checkpoints after its start ``fork_step``: every ``every`` updates,
    or ``checkpoints`` evenly spaced (default ``min(10, steps)``); the last update is always one."""
    if every is not None:
        if every < 1:
            raise TrainError(f"every must be >= 1 update, got {every}")
        rel = set(range(every, steps + 1, every))
    else:
        n = min(10, steps) if checkpoints is None else checkpoints
        if not 1 <= n <= steps:
            raise TrainError(f"need 1 <= checkpoints <= fork steps ({steps}), got {n}")
        rel = {max(1, round(steps * i / n)) for i in range(1, n + 1)}
    rel.add(steps)
    return sorted(fork_step + r for r in rel)


def fork_trajectory(
    parent: "str | Path | Trajectory",
    at: "str | int",
    schedule: ForkSchedule,
    out_dir: str | Path,
    seeds: Sequence[int] = (0,),
    checkpoints: int | None = None,
    every: int | None = None,
    save_optimizer: bool = False,
    restart_moments: bool = False,
    progress: ProgressArg = True,
    overwrite: bool = False,
    data_dir: str | Path | None = None,
    num_threads: int | None = None,
) -> list[Trajectory]:
    """Fork ``parent``'s checkpoint ``at`` (label such as ``"step-000300"``, a step number, or
    ``"last"``) under ``schedule`` once per seed; each fork goes to ``out_dir/<name>/`` (see the
    module docstring) and ``out_dir/forks.json`` indexes them. Returns one trajectory per seed.

    ``checkpoints`` / ``every``: fork checkpoint spacing (:func:`fork_checkpoint_steps`).
    ``save_optimizer``: also save AdamW state in the fork's checkpoints (forkable forks).
    ``restart_moments``: allow a parent checkpoint without AdamW state (moments restart at zero).
    ``progress``: updates done / planned, loss and LR on stderr (``[fork]``; False: silent).
    A finished fork with the same lineage and config is returned as is; a folder holding another
    run raises :class:`TrainError` unless ``overwrite``. ``data_dir``: tokenizer / token-stream
    cache (default: the parent's ``data/`` when present, else ``out_dir/data``). ``num_threads`` as
    in :func:`losslens.lm.train.tiny.train_tiny`. Cost per seed: ``schedule.steps`` training updates
    plus (number of checkpoints + 1) validation evaluations.
    """
    ptraj = parent if isinstance(parent, Trajectory) else Trajectory.from_folder(parent)
    if "config" not in ptraj.meta:
        raise TrainError(
            f"{ptraj.meta.get('folder', ptraj.name)} is not a train-tiny trajectory (no config in "
            "trajectory.json); forks need the parent's training config"
        )
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise TrainError(f"seeds must be distinct and non-empty, got {seeds}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pfolder = Path(ptraj.meta["folder"])
    if data_dir is None:
        data_dir = pfolder / "data" if (pfolder / "data" / "data.json").is_file() else out / "data"
    pcfg = TrainConfig.from_dict(ptraj.meta["config"])
    if num_threads is None:
        num_threads = 1 if pcfg.hidden_size <= 64 else 0
    results = []
    with torch_threads(num_threads):
        for seed in seeds:
            results.append(
                _fork_one(
                    ptraj,
                    at,
                    schedule,
                    out,
                    seed,
                    checkpoints,
                    every,
                    save_optimizer,
                    restart_moments,
                    progress,
                    overwrite,
                    Path(data_dir),
                )
            )
            write_fork_index(out, results)
    return results


def write_fork_index(
    out: Path, trajs: list[Trajectory], fmt: str = FORKS_FORMAT, origin: Sequence[str] = ("parent", "parent_checkpoint")
) -> None:
    """Add ``trajs`` to ``out/forks.json`` (created in format ``fmt``): one entry per fork folder with its
    condition, seed, the lineage fields ``origin`` (where it was forked from), schedule and final
    validation loss; entries of other forks already there are kept."""
    path = out / "forks.json"
    index = json.loads(path.read_text()) if path.is_file() else {"format": fmt, "forks": []}
    entries = {e["path"]: e for e in index.get("forks", [])}
    for t in trajs:
        f = t.meta["fork"]
        name = Path(t.meta["folder"]).name
        entries[name] = {
            "path": name,
            "condition": f["condition"],
            "seed": f["seed"],
            **{k: f[k] for k in origin},
            "schedule": f["schedule"],
            "final_val_loss": t[-1].meta.get("val_loss"),
        }
    index["forks"] = sorted(entries.values(), key=lambda e: (e["condition"], e["seed"]))
    write_json(path, index)


def _fork_one(
    ptraj: Trajectory,
    at,
    schedule: ForkSchedule,
    out: Path,
    seed: int,
    checkpoints,
    every,
    save_optimizer: bool,
    restart_moments: bool,
    progress: ProgressArg,
    overwrite: bool,
    data_dir: Path,
) -> Trajectory:
    t_start = time.perf_counter()
    pcfg = TrainConfig.from_dict(ptraj.meta["config"])
    ref = parent_checkpoint(ptraj, at)
    s0 = int(ref.step)
    parent_fn = lr_function(ptraj.meta)
    parent_lr = float(ref.lr) if ref.lr is not None else parent_fn(s0)
    sched = schedule.resolve(pcfg, parent_lr)
    condition = f"{schedule_label(schedule, sched)}-at{s0}-n{sched.steps}"
    name = f"{condition}-s{seed}"
    folder = out / name
    ckpt_steps = fork_checkpoint_steps(s0, sched.steps, checkpoints, every)
    cfg = replace(
        pcfg,
        steps=s0 + sched.steps,
        checkpoints=len(ckpt_steps),
        data_seed=seed,
        name=name,
        save_optimizer=save_optimizer,
    )
    state_file = Path(ref.location) / "training_state.pt"
    if state_file.is_file():
        opt_note = f"restored from the parent's {ref.label}/training_state.pt"
    elif restart_moments:
        opt_note = "restarted: the parent checkpoint has no training_state.pt, AdamW moments start from zero"
    else:
        raise TrainError(
            f"parent checkpoint {ref.location} has no AdamW state (training_state.pt), so the fork "
            "cannot resume exactly; retrain the parent with save_optimizer=True (--save-optimizer), or "
            "pass restart_moments=True (--restart-moments) to restart AdamW's moments from zero"
        )
    lineage = {
        "parent": str(Path(ptraj.meta["folder"]).resolve()),
        "parent_name": ptraj.name,
        "parent_checkpoint": ref.label,
        "parent_step": s0,
        "parent_lr": parent_lr,
        "parent_val_loss": ref.meta.get("val_loss"),
        "schedule": sched.to_dict(),
        "label": sched.label,
        "condition": condition,
        "seed": seed,
        "data_seed": seed,
        "optimizer_state": opt_note,
        "checkpoint_steps": ckpt_steps,
    }

    # an existing fork folder: return it when finished with the same lineage, else refuse or redo
    tj_path = folder / "trajectory.json"
    if tj_path.is_file():
        old = json.loads(tj_path.read_text())
        same = old.get("config") == cfg.to_dict() and _same_lineage(old.get("fork") or {}, lineage)
        if same and old.get("complete") and not overwrite:
            return Trajectory.from_folder(folder)
        if not same and not overwrite:
            raise TrainError(f"{folder} already holds a different run; use another --out or overwrite=True (--force)")
        for p in folder.glob("step-*"):
            if p.is_dir():
                shutil.rmtree(p)
        tj_path.unlink()
    folder.mkdir(parents=True, exist_ok=True)

    # data: the parent's tokenizer, training stream and validation set (the parent's data seed)
    tok, train, val = prepare_data(pcfg, folder, data_dir)
    pval = (ptraj.meta.get("data") or {}).get("validation_hash")
    if pval is not None and val.content_hash != pval:
        raise TrainError(
            f"the rebuilt validation set differs from the parent's ({val.content_hash[:12]} vs "
            f"{pval[:12]}): the embedded corpus or tokenizer changed (another Python build?)"
        )
    tok.save_pretrained(str(folder / "tokenizer"))

    # model + optimizer at the parent checkpoint
    model = build_model(pcfg, tok)
    model.load_state_dict(CheckpointLoader(ref).load(ref).state_dict())
    optimizer = build_optimizer(model, cfg)
    if state_file.is_file():
        optimizer.load_state_dict(torch.load(state_file, map_location="cpu", weights_only=True)["optimizer"])
    start_loss = evaluate(model, val).loss
    pv = lineage["parent_val_loss"]
    lineage["start_val_loss"] = start_loss
    lineage["start_loss_matches"] = None if pv is None else bool(abs(start_loss - pv) <= 1e-6 * max(1.0, abs(pv)))

    data = {**(ptraj.meta.get("data") or {}), "train_tokens": len(train), "data_seed": seed}
    note = (
        f"fork of {ptraj.name} at {ref.label} (step {s0}) under {sched.label}, seed {seed}; optimizer state {opt_note}"
    )
    record = trajectory_record(cfg, model, val, data, ptraj.meta.get("versions"), [note], fork=lineage)
    start_folder = folder / f"step-{s0:06d}"
    model.train()
    save_checkpoint(start_folder, model, tok, optimizer if save_optimizer else None, s0)
    record["checkpoints"].append(
        fork_start_entry(
            start_folder.name,
            s0,
            s0 * cfg.tokens_per_step,
            parent_lr,
            ref.meta.get("train_loss"),
            start_loss,
            time.perf_counter() - t_start,
        )  # fmt: skip
    )
    write_json(tj_path, record)

    run_loop(
        model,
        optimizer,
        train,
        val,
        tok,
        folder,
        record,
        cfg,
        start=s0,
        checkpoint_steps=ckpt_steps,
        lr_fn=lambda step: sched.lr(step - s0, parent_fn, s0),
        progress=progress,
        t_start=t_start,
        checkpoint_extra=lambda step: {"phase": sched.phase(step - s0)},
        label="fork",
    )
    return Trajectory.from_folder(folder)


def schedule_label(requested: ForkSchedule, resolved: ForkSchedule) -> str:
    """The fork's schedule label: the resolved label, plus ``-min<lr>`` when ``min_lr`` was given."""
    label = resolved.label
    if requested.min_lr is not None:
        label += f"-min{format_value(float(requested.min_lr))}"
    return label


def _same_lineage(a: dict, b: dict) -> bool:
    keys = ("parent", "parent_checkpoint", "parent_step", "schedule", "seed", "checkpoint_steps", "optimizer_state")
    return all(a.get(k) == b.get(k) for k in keys)
