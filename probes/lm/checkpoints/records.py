"""What a trajectory folder records about its checkpoints, applied to their refs: ``trajectory.json``
(written by ``losslens train-tiny``) and HF Trainer's ``trainer_state.json`` (``log_history``: LR,
tokens and losses). Used by :meth:`losslens.lm.checkpoints.trajectory.Trajectory.from_folder`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from losslens.lm.checkpoints.errors import CorruptCheckpointError
from losslens.lm.checkpoints.refs import CheckpointRef


def apply_trajectory_json(refs: list[CheckpointRef], data: dict, root: Path) -> list[CheckpointRef]:
    """Step, tokens, LR and the other fields ``trajectory.json`` records per checkpoint (matched by
    folder name, else by step), marked ``meta["source"] = "trajectory.json"``."""
    by_path = {Path(e["path"]).name: e for e in data.get("checkpoints", []) if e.get("path")}
    by_step = {e["step"]: e for e in data.get("checkpoints", []) if e.get("step") is not None}
    out = []
    for r in refs:
        e = by_path.get(Path(r.location or "").name) or by_step.get(r.step)
        if e is None:
            out.append(r)
            continue
        extra = {k: v for k, v in e.items() if k not in ("path", "step", "tokens", "lr")}
        out.append(
            r.replace(
                step=e.get("step", r.step),
                tokens=e.get("tokens", r.tokens),
                lr=e.get("lr", r.lr),
                meta={**r.meta, **extra, "source": "trajectory.json"},
            )
        )
    return out


def trainer_states(root: Path, refs: list[CheckpointRef]) -> list[dict]:
    """The HF Trainer ``trainer_state.json`` files of a trajectory folder and of its checkpoints, read.
    Raises :class:`CorruptCheckpointError` for one that is not JSON."""
    files = [root / "trainer_state.json"] + [
        Path(r.location) / "trainer_state.json" for r in refs if r.kind == "hf_dir" and r.location
    ]
    states = []
    for f in files:
        if f.is_file():
            try:
                states.append(json.loads(f.read_text()))
            except (ValueError, UnicodeDecodeError) as exc:  # its LR and tokens would silently go missing
                raise CorruptCheckpointError(
                    f"{f} is not valid JSON ({exc}); the learning rates and tokens of this trajectory come from it. "
                    "Repair it (the HF Trainer writes it next to each checkpoint), or delete it and give the schedule "
                    "with --schedule / a trajectory.json"
                ) from exc
    return states


def apply_trainer_state(refs: list[CheckpointRef], states: list[dict]) -> list[CheckpointRef]:
    """LR / tokens / losses from HF Trainer ``log_history``: the entry logged at the checkpoint's
    step, else the latest entry logged before it (Trainer logs every ``logging_steps``)."""
    seen, log = set(), []
    for st in states:
        for e in st.get("log_history", []):
            key = json.dumps(e, sort_keys=True)
            if "step" in e and key not in seen:
                seen.add(key)
                log.append(e)
    log.sort(key=lambda e: e["step"])

    def lookup(field_: str, step: int, exact: bool = False) -> tuple[Any, int] | None:
        best = None
        for e in log:
            if field_ in e and e["step"] <= step:
                best = (e[field_], e["step"])
        if best is not None and exact and best[1] != step:
            return None
        return best

    out = []
    for r in refs:
        if r.step is None:
            out.append(r)
            continue
        meta = dict(r.meta)
        lr, tokens = r.lr, r.tokens
        hit = lookup("learning_rate", r.step)
        if lr is None and hit is not None:
            lr = float(hit[0])
            meta["lr_logged_at"] = hit[1]
        hit = lookup("num_input_tokens_seen", r.step)
        if tokens is None and hit is not None:
            tokens = int(hit[0])
            meta["tokens_logged_at"] = hit[1]
        for src, dst in (("loss", "train_loss"), ("eval_loss", "val_loss")):
            hit = lookup(src, r.step, exact=True)
            if hit is not None and dst not in meta:
                meta[dst] = float(hit[0])
        out.append(r.replace(lr=lr, tokens=tokens, meta=meta))
    return out
