"""The token sets of a sweep: built once per study from the plan's data spec, and their hashes.

The eval / calibration / curvature sets (docs/science.md §1) come from saved files or are built
from the plan's source with the first checkpoint's tokenizer. Sequences are capped at the model's
context (``fit_context``), and a calibration set too short for a full-rank GPTQ/AWQ Hessian of the
widest quantized layer gets more batches (with a warning); the data hash counts the tokens used.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from typing import Any, Mapping

from losslens.geometry.base.errors import LosslensWarning
from losslens.study.sweep.plan import Plan


def build_data(plan: Plan, trajectory) -> dict:
    """The eval / calibration / curvature token sets of the plan (files, or built from the source)."""
    from losslens.lm.core.tokenset import TokenSet

    files = dict(plan.data.files)
    out = {name: TokenSet.load(path) for name, path in files.items()}
    todo = {n: s for n, s in plan.data.shapes.items() if n not in out}
    if todo:
        from losslens.lm.data import default_token_sets

        source = None if plan.data.source == "embedded" else plan.data.source
        shapes = dict(plan.data.shapes)
        cfg = _first_config(trajectory)
        if plan.data.fit_context:
            ctx = cfg.get("max_position_embeddings") or cfg.get("n_positions")
            if ctx:
                shapes = {k: (nb, b, min(s, int(ctx))) for k, (nb, b, s) in shapes.items()}
        if "calibration" in todo and _needs_calibration(plan):
            shapes["calibration"] = _calibration_for(shapes["calibration"], _widest_input(cfg))
        built = default_token_sets(trajectory, source=source, seed=plan.data.seed, shapes=shapes)
        for n in todo:
            out[n] = built[n]
    return out


def _needs_calibration(plan: Plan) -> bool:
    from losslens.lm.quant import QuantSpec

    return any(QuantSpec.parse(spec).needs_calibration for spec in (*plan.quant, *plan.directional))


def _first_config(trajectory) -> dict:
    """The config of the trajectory's first real checkpoint, or {} when it has none readable
    (the plan's shapes then stand)."""
    try:
        from losslens.lm.checkpoints import read_config

        first = next(r for r in trajectory if getattr(r, "kind", None) != "derived")
        return dict(read_config(first))
    except Exception:  # noqa: BLE001 - no config: the plan's shapes stand
        return {}


def _widest_input(cfg: Mapping[str, Any]) -> int | None:
    """The widest input of a decoder linear from a checkpoint config (hidden size, MLP width),
    or None."""
    sizes = [cfg.get(k) for k in ("hidden_size", "intermediate_size", "n_inner", "ffn_dim", "n_embd", "d_model")]
    sizes = [int(v) for v in sizes if isinstance(v, int) and v > 0]
    return max(sizes) if sizes else None


def _calibration_for(shape: tuple[int, int, int], widest: int | None) -> tuple[int, int, int]:
    """The calibration shape with enough batches for a full-rank GPTQ/AWQ Hessian of the widest
    quantized layer (rows ≥ in_features); the plan's shape when it already has them. The change is
    reported (a warning) and recorded in the data hash, which counts the tokens actually used."""
    nb, b, s = shape
    if widest is None or nb * b * s >= widest:
        return shape
    need = -(-widest // (b * s))
    warnings.warn(
        f"calibration set {nb}×{b}×{s} has {nb * b * s} token rows, fewer than the widest quantized layer's "
        f"{widest} inputs: using {need} batches ({need * b * s} rows) so that GPTQ/AWQ get a full-rank H",
        LosslensWarning,  # the CLI shows it as one `warning: …` line
        stacklevel=3,
    )
    return need, b, s


def data_hashes(token_sets: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    """(combined SHA-256, per-set content hashes) of the token sets."""
    per = {k: v.content_hash for k, v in sorted(token_sets.items())}
    return hashlib.sha256(json.dumps(per, sort_keys=True).encode()).hexdigest(), per
