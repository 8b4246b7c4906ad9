"""Grids of tiny training runs: the cartesian product of config values, one run folder each.

:func:`train_sweep` (``losslens train-tiny --sweep lr=1e-3,3e-3 --sweep wd=0.1,0.5 --seeds 0,1``)
trains every config of :func:`plan_sweep` into a folder named like ``wsd-lr3e-3-wd0.5-s0``,
indexed in ``OUT/sweep.json``; reruns skip finished runs.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from losslens.lm.checkpoints import Trajectory

from losslens.lm.train.config import TrainConfig, TrainError, format_value
from losslens.lm.train.run_files import write_json
from losslens.lm.train.tiny import train_tiny

__all__ = [
    "train_sweep",
    "plan_sweep",
    "parse_sweep",
    "normalize_grid",
    "sweep_run_name",
    "SWEEP_ALIASES",
    "SWEEP_FORMAT",
]

SWEEP_FORMAT = "losslens-sweep/1"
#: short names accepted in sweep grids (``--sweep lr=...``) for TrainConfig fields
SWEEP_ALIASES = {
    "lr": "peak_lr",
    "wd": "weight_decay",
    "hidden": "hidden_size",
    "layers": "num_layers",
    "heads": "num_heads",
    "vocab": "vocab_size",
    "batch": "batch_size",
    "seq": "seq_len",
}
#: how each field appears in run names (``wsd-lr3e-3-wd0.5-s0``); other fields use their own name
_NAME_KEYS = {
    "peak_lr": "lr",
    "weight_decay": "wd",
    "hidden_size": "h",
    "num_layers": "layers",
    "num_heads": "heads",
    "vocab_size": "vocab",
    "batch_size": "batch",
    "seq_len": "seq",
    "min_lr_ratio": "minlr",
    "data_seed": "ds",
    "grad_clip": "clip",
}


def _field_types() -> dict[str, str]:
    return {f.name: str(f.type) for f in fields(TrainConfig)}


def _coerce(name: str, value: Any) -> Any:
    """``value`` (often a CLI string) converted to the type of TrainConfig field ``name``."""
    kind = _field_types()[name]
    if not isinstance(value, str):
        return value
    if value.lower() == "none" and "None" in kind:
        return None
    try:
        if kind.startswith("bool"):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("true", "1", "yes")
        if kind.startswith("int"):
            return int(value)
        if kind.startswith("float"):
            return float(value)
    except ValueError:
        raise TrainError(f"sweep value {value!r} for {name} is not of type {kind}") from None
    return value


def parse_sweep(specs: "list[str] | tuple[str, ...]") -> dict[str, list]:
    """``["lr=1e-3,3e-3", "wd=0.1,0.5"]`` -> ``{"peak_lr": [0.001, 0.003], "weight_decay": [0.1, 0.5]}``.
    Keys: TrainConfig field names or :data:`SWEEP_ALIASES`; values converted to the field's type."""
    grid: dict[str, list] = {}
    for spec in specs:
        key, sep, values = spec.partition("=")
        if not sep or not values.strip():
            raise TrainError(f"bad --sweep {spec!r}: expected KEY=V1,V2,... (e.g. lr=1e-3,3e-3,1e-2)")
        grid[key.strip()] = [v.strip() for v in values.split(",") if v.strip()]
    return normalize_grid(grid)


def normalize_grid(grid: dict) -> dict[str, list]:
    """Resolve aliases, convert values to the fields' types, reject unknown/duplicate keys and values."""
    known = set(_field_types())
    out: dict[str, list] = {}
    for key, values in grid.items():
        name = SWEEP_ALIASES.get(key, key)
        if name not in known or name in ("seed", "name"):
            hint = (
                "use seeds=/--seeds for seeds"
                if name == "seed"
                else f"choose from {sorted(set(SWEEP_ALIASES) | known - {'seed', 'name'})}"
            )
            raise TrainError(f"cannot sweep {key!r}: {hint}")
        if name in out:
            raise TrainError(f"{key!r} is swept twice")
        vals = [_coerce(name, v) for v in (values if isinstance(values, (list, tuple)) else [values])]
        if not vals:
            raise TrainError(f"sweep {key!r} has no values")
        if len({format_value(v) for v in vals}) != len(vals):
            raise TrainError(f"sweep {key!r} repeats a value: {vals}")
        out[name] = vals
    return out


def sweep_run_name(config: TrainConfig, keys: "list[str] | tuple[str, ...]" = ()) -> str:
    """``{schedule}-{key}{value}...-s{seed}`` with the swept ``keys`` in order, e.g.
    ``wsd-lr3e-3-wd0.5-s0`` (the schedule is always first, the seed always last)."""
    parts = [config.schedule]
    for k in keys:
        if k == "schedule":
            continue
        v = getattr(config, k)
        parts.append(format_value(v) if isinstance(v, str) else f"{_NAME_KEYS.get(k, k)}{format_value(v)}")
    parts.append(f"s{config.seed}")
    return "-".join(parts)


def plan_sweep(
    base_config: TrainConfig, grid: dict, seeds: "list[int] | tuple[int, ...] | None" = None
) -> list[TrainConfig]:
    """The configs of a sweep: the cartesian product of ``grid`` (values vary slowest for the first
    key) times ``seeds`` (innermost; default ``[base_config.seed]``), each named by
    :func:`sweep_run_name`."""
    grid = normalize_grid(grid)
    seeds = [base_config.seed] if seeds is None else [int(s) for s in seeds]
    if len(set(seeds)) != len(seeds) or not seeds:
        raise TrainError(f"seeds must be distinct and non-empty, got {seeds}")
    keys = list(grid)
    configs = []
    for combo in itertools.product(*(grid[k] for k in keys)):
        for seed in seeds:
            cfg = replace(base_config, **dict(zip(keys, combo)), seed=seed, name=None)
            configs.append(replace(cfg, name=sweep_run_name(cfg, keys)))
    return configs


def train_sweep(
    base_config: TrainConfig,
    grid: dict,
    out_dir: str | Path,
    seeds: "list[int] | tuple[int, ...] | None" = None,
    progress: bool = True,
    overwrite: bool = False,
    data_dir: str | Path | None = None,
    num_threads: int | None = None,
    on_run=None,
) -> list[Trajectory]:
    """Train every config of :func:`plan_sweep` into ``out_dir/<run name>/`` and index them in
    ``out_dir/sweep.json``.

    ``grid``: ``{field or alias: [values]}`` (e.g. ``{"lr": [1e-3, 3e-3], "wd": [0.1, 0.5]}``;
    strings are converted). Runs already finished with the same config are skipped (status
    ``cached``); a run that diverges is recorded as ``failed`` (with the error) and the sweep goes on.
    A folder holding a different run raises :class:`TrainError` before anything is trained
    (unless ``overwrite``). The runs share one tokenizer / token-stream cache (``data_dir``, default
    ``out_dir/data``). ``on_run(entry_dict)`` is called after each run. Returns the trajectories
    of the runs that finished, in plan order. Cost: the sum of the runs (sequential).
    ``sweep.json``: ``{"format", "base_config", "grid", "seeds", "runs": [{"name", "path", "params",
    "seed", "status" (pending|done|cached|failed), "error", "final_val_loss", "seconds"}]}``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    grid = normalize_grid(grid)
    configs = plan_sweep(base_config, grid, seeds)
    data_dir = Path(data_dir) if data_dir is not None else out / "data"
    entries = []
    for cfg in configs:
        tj = out / cfg.name / "trajectory.json"
        old = json.loads(tj.read_text()) if tj.is_file() else None
        if old is not None and old.get("config") != cfg.to_dict() and not overwrite:
            raise TrainError(
                f"{tj.parent} already holds a run with a different config; use another --out or "
                "overwrite=True (--force)"
            )
        cached = bool(old and old.get("complete") and old.get("config") == cfg.to_dict() and not overwrite)
        entries.append(
            {
                "name": cfg.name,
                "path": cfg.name,
                "params": {k: getattr(cfg, k) for k in grid},
                "seed": cfg.seed,
                "status": "cached" if cached else "pending",
                "error": None,
                "final_val_loss": (old["checkpoints"][-1]["val_loss"] if cached and old.get("checkpoints") else None),
                "seconds": old.get("seconds") if cached else None,
            }
        )
    index = {
        "format": SWEEP_FORMAT,
        "base_config": base_config.to_dict(),
        "grid": grid,
        "seeds": sorted({c.seed for c in configs}, key=[c.seed for c in configs].index),
        "runs": entries,
    }
    write_json(out / "sweep.json", index)
    trajectories = []
    for cfg, entry in zip(configs, entries):
        if entry["status"] != "cached":
            try:
                train_tiny(
                    cfg,
                    out / cfg.name,
                    progress=progress,
                    overwrite=overwrite,
                    data_dir=data_dir,
                    num_threads=num_threads,
                )
            except TrainError as exc:
                entry.update(status="failed", error=str(exc))
            else:
                entry["status"] = "done"
        if entry["status"] != "failed":
            traj = Trajectory.from_folder(out / cfg.name)
            trajectories.append(traj)
            entry["final_val_loss"] = traj[-1].meta.get("val_loss")
            entry["seconds"] = traj.meta.get("seconds")
        write_json(out / "sweep.json", index)
        if on_run is not None:
            on_run(dict(entry))
    return trajectories
