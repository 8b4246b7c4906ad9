"""Derived checkpoints: LAWA / soup averages of listed checkpoints (docs/science.md §6).

A derived checkpoint is a weighted mean of its sources' weights, computed when it is loaded
(:class:`~losslens.lm.checkpoints.loader.CheckpointLoader`: float64 accumulation, cast back to the
sources' dtype); its step / tokens / LR are those of its last source and ``kind == "derived"``.
"""

from __future__ import annotations

from typing import Sequence

from losslens.lm.checkpoints.errors import ArchitectureMismatchError, CheckpointError
from losslens.lm.checkpoints.files import read_config
from losslens.lm.checkpoints.refs import CheckpointRef

__all__ = ["lawa"]


def lawa(
    refs: Sequence[CheckpointRef], weights: Sequence[float] | None = None, label: str | None = None
) -> CheckpointRef:
    """A derived checkpoint: the weighted mean of ``refs``' weights (uniform by default; weights are
    normalised to sum 1), computed when loaded. Its step / tokens / LR are the last source's.
    Configs are checked now (same ``model_type`` and dimensions when readable); parameter names
    and shapes when loaded. Raises :class:`ArchitectureMismatchError` naming the odd checkpoint.
    """
    refs = list(refs)
    if not refs:
        raise CheckpointError("lawa() needs at least one checkpoint")
    if weights is None:
        w = [1.0 / len(refs)] * len(refs)
    else:
        if len(weights) != len(refs):
            raise CheckpointError(f"lawa(): {len(weights)} weights for {len(refs)} checkpoints")
        total = float(sum(weights))
        if total == 0 or any(x < 0 for x in weights):
            raise CheckpointError("lawa(): weights must be non-negative and not all zero")
        w = [float(x) / total for x in weights]
    _check_configs(refs)
    last = refs[-1]
    label = label or f"lawa{len(refs)}@{last.label}"
    return CheckpointRef(
        label,
        last.step,
        last.tokens,
        last.lr,
        None,
        "derived",
        None,
        tuple(r.label for r in refs),
        tuple(w),
        meta={"method": "lawa" if weights is None else "soup", "sources": tuple(refs)},
    )


_ARCH_KEYS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
    "n_embd",
    "n_layer",
    "n_head",
    "d_model",
)


def _check_configs(refs: Sequence[CheckpointRef]) -> None:
    first = None
    for r in refs:
        if r.derived or r.kind == "hub":
            continue  # hub: avoid resolving files at construction time; checked when loaded
        try:
            cfg = read_config(r)
        except CheckpointError:
            continue  # reported when loaded
        arch = {k: cfg.get(k) for k in _ARCH_KEYS if k in cfg}
        if first is None:
            first = (r.label, arch)
        elif arch != first[1]:
            diff = {
                k: (first[1].get(k), arch.get(k)) for k in set(arch) | set(first[1]) if first[1].get(k) != arch.get(k)
            }
            raise ArchitectureMismatchError(
                f"cannot average checkpoint {r.label!r} with {first[0]!r}: their configs differ in {diff}"
            )
