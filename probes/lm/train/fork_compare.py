"""Comparing schedule forks by their quantization gap (seed 004, §5).

:func:`compare_forks` measures the quantization gap ``ppl_gap = exp(q_loss - fp_loss) - 1`` (a
fraction, 0.05 = 5%) at every checkpoint of every fork (:mod:`losslens.lm.train.forks`);
:func:`fork_wins` / :func:`wins_summary` count which condition has the lower gap per seed pair.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from losslens.lm.checkpoints import CheckpointLoader, Trajectory
from losslens.lm.core.threads import torch_threads
from losslens.lm.data import default_token_sets, load_tokenizer, tokenizer_fingerprint
from losslens.lm.quant import quantization_error

from losslens.lm.train.config import TrainError

__all__ = ["find_forks", "compare_forks", "fork_wins", "wins_summary"]


def find_forks(paths: Iterable[str | Path]) -> list[Path]:
    """Fork folders among ``paths``: each path is a fork folder (its trajectory.json has ``fork``)
    or a folder whose sub-folders are forks (e.g. the ``--out`` of ``losslens fork``)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if _is_fork(p):
            found.append(p)
            continue
        subs = sorted(c for c in p.iterdir() if c.is_dir() and _is_fork(c)) if p.is_dir() else []
        if not subs:
            raise TrainError(f"{p} is neither a fork folder nor a folder of forks (no trajectory.json with 'fork')")
        found.extend(subs)
    uniq: list[Path] = []
    for p in found:
        if p.resolve() not in {u.resolve() for u in uniq}:
            uniq.append(p)
    return uniq


def _is_fork(p: Path) -> bool:
    tj = p / "trajectory.json"
    if not tj.is_file():
        return False
    try:
        return bool(json.loads(tj.read_text()).get("fork"))
    except ValueError:
        return False


def compare_forks(
    fork_dirs: Iterable[str | Path],
    spec: str = "rtn:3:row",
    cool_only: bool = True,
    eval_set=None,
    quick: bool = False,
    pairing: str = "seed",
    by: str = "final",
    progress: bool = False,
    num_threads: int | None = None,
):
    """Quantization gap at every checkpoint of every fork, with wins per seed pair.

    ``fork_dirs``: fork folders or folders of forks (:func:`find_forks`). For each checkpoint
    (with ``cool_only``: those not inside a bump, i.e. phase ``start`` / ``cool`` / none) it runs
    :func:`losslens.lm.quant.quantization_error` with ``spec`` on ``eval_set`` (default: the held-out
    ``"eval"`` set of :func:`losslens.lm.data.default_token_sets` for the first fork, ``quick`` as
    there; all forks must share its tokenizer).

    Returns a pandas DataFrame, one row per (fork, checkpoint): ``fork, condition, seed, parent,
    step, t`` (updates since the fork), ``lr, phase, fork_start, val_loss, fp_loss, q_loss, gap``
    (ppl gap, fraction), ``rel_loss_error, seconds``. ``df.attrs``: ``spec``, ``cool_only``,
    ``wins`` (:func:`fork_wins` with ``pairing`` / ``by``) and ``summary`` (:func:`wins_summary`).
    The fork-start checkpoint of forks sharing a parent checkpoint is measured once.
    ``num_threads``: torch CPU threads (restored afterwards); ``None`` = 1 for hidden size <= 64
    (tiny models; 2 threads on a loaded 2-core machine were measured ~25x slower), else torch's
    default; 0 = torch's default.
    Cost: per checkpoint, one quantization plus two evaluations of ``eval_set`` (tiny preset,
    4,096 eval tokens: ~0.1-0.2 s).
    """
    dirs = find_forks(fork_dirs)
    if not dirs:
        raise TrainError("no forks to compare")
    trajs = [Trajectory.from_folder(d) for d in dirs]
    if num_threads is None:
        hidden = (trajs[0].meta.get("config") or {}).get("hidden_size", 0)
        num_threads = 1 if hidden and hidden <= 64 else 0
    with torch_threads(num_threads):
        return _compare(trajs, spec, cool_only, eval_set, quick, pairing, by, progress)


def _compare(
    trajs: list[Trajectory], spec, cool_only: bool, eval_set, quick: bool, pairing: str, by: str, progress: bool
):
    import pandas as pd

    if eval_set is None:
        eval_set = default_token_sets(trajs[0], quick=quick)["eval"]
        fp0 = eval_set.meta.get("tokenizer_fingerprint")
        for t in trajs[1:]:
            if fp0 is not None and tokenizer_fingerprint(load_tokenizer(t)) != fp0:
                raise TrainError(
                    f"{t.meta['folder']} uses another tokenizer than {trajs[0].meta['folder']}; "
                    "compare forks of one parent (or pass eval_set)"
                )
    rows = []
    start_cache: dict[tuple, Any] = {}  # (parent folder, parent step) -> QuantError of the shared fork start
    for traj in trajs:
        fork = traj.meta["fork"]
        loader = CheckpointLoader(traj)
        for ref in traj.real:
            phase = ref.meta.get("phase")
            if cool_only and phase == "bump":
                continue
            key = (fork["parent"], fork["parent_step"]) if ref.meta.get("fork_start") else None
            if key is not None and key in start_cache:
                q = start_cache[key]
            else:
                q = quantization_error(loader.load(ref), spec, eval_set)
                if key is not None:
                    start_cache[key] = q
            rows.append(
                {
                    "fork": traj.name,
                    "condition": fork["condition"],
                    "seed": fork["seed"],
                    "parent": fork["parent_name"],
                    "step": ref.step,
                    "t": ref.step - fork["parent_step"],
                    "lr": ref.lr,
                    "phase": phase,
                    "fork_start": bool(ref.meta.get("fork_start", False)),
                    "val_loss": ref.meta.get("val_loss"),
                    "fp_loss": q.fp_loss,
                    "q_loss": q.q_loss,
                    "gap": q.ppl_gap,
                    "rel_loss_error": q.rel_loss_error,
                    "seconds": q.seconds,
                }
            )
            if progress:
                print(f"  {traj.name} {ref.label}: gap {q.ppl_gap:.4%}", flush=True)
    df = pd.DataFrame(rows)
    wins = fork_wins(df, pairing=pairing, by=by)
    df.attrs.update(spec=str(spec), cool_only=cool_only, pairing=pairing, by=by, wins=wins, summary=wins_summary(wins))
    return df


def _per_fork_value(df, by: str):
    """{(condition, seed): (value, step)}: the gap at the fork's last non-start checkpoint in ``df``
    (``by="final"``) or the mean over its non-start checkpoints (``by="mean"``)."""
    out = {}
    for (cond, seed), g in df[~df["fork_start"]].groupby(["condition", "seed"], sort=False):
        g = g.sort_values("step")
        if by == "final":
            out[(cond, seed)] = (float(g["gap"].iloc[-1]), int(g["step"].iloc[-1]))
        elif by == "mean":
            out[(cond, seed)] = (float(g["gap"].mean()), int(g["step"].iloc[-1]))
        else:
            raise TrainError(f"by must be 'final' or 'mean', got {by!r}")
    return out


def fork_wins(df, pairing: str = "seed", by: str = "final"):
    """Pairwise wins between fork conditions: for every pair of conditions (A, B) (in order of
    first appearance) and every pair of their forks -- the same seed (``pairing="seed"``) or every
    seed of A against every seed of B (``"all"``, the 3 x 3 = 9 comparisons of seed 004) -- which
    has the lower gap (``by`` = the ``final`` checkpoint's gap, or the ``mean`` over the fork's
    checkpoints in ``df``). Columns: ``condition_a, condition_b, seed_a, seed_b, gap_a, gap_b,
    step_a, step_b, diff`` (gap_a - gap_b), ``winner`` (``"a"``, ``"b"`` or ``"tie"``)."""
    import pandas as pd

    if pairing not in ("seed", "all"):
        raise TrainError(f"pairing must be 'seed' or 'all', got {pairing!r}")
    cols = ["condition_a", "condition_b", "seed_a", "seed_b", "gap_a", "gap_b", "step_a", "step_b", "diff", "winner"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    vals = _per_fork_value(df, by)
    conds = list(dict.fromkeys(df["condition"]))
    rows = []
    for i, a in enumerate(conds):
        for b in conds[i + 1 :]:
            seeds_a = sorted(s for c, s in vals if c == a)
            seeds_b = sorted(s for c, s in vals if c == b)
            pairs = (
                [(s, s) for s in seeds_a if s in seeds_b]
                if pairing == "seed"
                else [(sa, sb) for sa in seeds_a for sb in seeds_b]
            )
            for sa, sb in pairs:
                (ga, ta), (gb, tb) = vals[(a, sa)], vals[(b, sb)]
                rows.append(
                    {
                        "condition_a": a,
                        "condition_b": b,
                        "seed_a": sa,
                        "seed_b": sb,
                        "gap_a": ga,
                        "gap_b": gb,
                        "step_a": ta,
                        "step_b": tb,
                        "diff": ga - gb,
                        "winner": "a" if ga < gb else "b" if gb < ga else "tie",
                    }
                )
    return pd.DataFrame(rows, columns=cols)


def wins_summary(wins):
    """Per condition pair: ``n`` comparisons, ``a_wins``, ``b_wins``, ``ties``, ``mean_diff``
    (mean of gap_a - gap_b; negative = A lower)."""
    import pandas as pd

    cols = ["condition_a", "condition_b", "n", "a_wins", "b_wins", "ties", "mean_diff"]
    if wins.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for (a, b), g in wins.groupby(["condition_a", "condition_b"], sort=False):
        rows.append(
            {
                "condition_a": a,
                "condition_b": b,
                "n": len(g),
                "a_wins": int((g["winner"] == "a").sum()),
                "b_wins": int((g["winner"] == "b").sum()),
                "ties": int((g["winner"] == "tie").sum()),
                "mean_diff": float(g["diff"].mean()),
            }
        )
    return pd.DataFrame(rows, columns=cols)
