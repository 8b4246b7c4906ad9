"""Blocks of a language model's parameters for attribution: layers and module kinds.

A generic rule, no per-architecture table (as :func:`losslens.lm.core.modules.find_blocks`): a parameter
inside decoder block i belongs to layer ``layer{i}``; its kind is the block's child module that owns
it (names with ``norm`` or starting with ``ln`` → ``norm``, checked first; then ``attention``/``self_attn``/
``attn`` → ``attention``; ``mlp``/``ffn``/``feed_forward`` → ``mlp``; any other child keeps its name).
Parameters outside the blocks are ``embeddings`` (an ``nn.Embedding`` or the model's output
embeddings, i.e. the LM head) or ``other`` (final norm, ...).

Partitions (:data:`PARTITIONS`): ``layer`` (one block per decoder layer, plus ``embeddings`` /
``other``), ``kind`` (attention / mlp / norm / embeddings / ...), ``layer_kind`` (``layer0.attention``,
...), ``module`` (the owning module's dotted name) and ``parameter`` (one per tensor).
"""

from __future__ import annotations

from typing import Sequence

from torch import nn

from losslens.geometry.base.errors import LosslensError
from losslens.geometry.base.params import literal_glob
from losslens.lm.core.modules import ModuleSelectionError, find_blocks

PARTITIONS = ("layer", "kind", "layer_kind", "module", "parameter")


class BlockError(LosslensError, ValueError):
    """An unknown partition, or a parameter name the model does not have."""


def module_kind(child: str) -> str:
    """The kind of a decoder block's child module from its name (see the module docstring)."""
    low = child.lower()
    if "norm" in low or low.startswith("ln"):  # first: post_attention_layernorm is a norm
        return "norm"
    if "attn" in low or "attention" in low:
        return "attention"
    if "mlp" in low or "ffn" in low or "feed_forward" in low or "feedforward" in low:
        return "mlp"
    return child


def _outside_kind(model: nn.Module, owner: nn.Module) -> str:
    out_emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(owner, nn.Embedding) or (out_emb is not None and owner is out_emb):
        return "embeddings"
    return "other"


def _labels(model: nn.Module, name: str, prefix: str | None, modules: dict[str, nn.Module]) -> tuple[str | None, str]:
    """(layer or None, kind) of parameter ``name``."""
    if prefix is not None and name.startswith(prefix + "."):
        rest = name[len(prefix) + 1 :].split(".")
        layer = f"layer{rest[0]}"
        kind = module_kind(rest[1]) if len(rest) > 2 else "other"
        return layer, kind
    owner = modules.get(name.rsplit(".", 1)[0] if "." in name else "", model)
    return None, _outside_kind(model, owner)


def block_members(model: nn.Module, names: Sequence[str], partition: str = "layer") -> dict[str, list[str]]:
    """``{block: [parameter names]}`` partitioning ``names`` (parameters of ``model``) by ``partition``.

    Blocks are ordered: layers by index, then ``embeddings`` / ``other``; kinds in first-seen order.
    Raises :class:`BlockError` for an unknown partition or name, or a layer partition of a model
    without decoder blocks.
    """
    if partition not in PARTITIONS:
        raise BlockError(f"unknown block partition {partition!r}; valid: {', '.join(PARTITIONS)}")
    params = dict(model.named_parameters())
    unknown = [n for n in names if n not in params]
    if unknown:
        raise BlockError(f"{type(model).__name__} has no parameter(s) {unknown[:3]}")
    if partition == "parameter":
        return {n: [n] for n in names}
    if partition == "module":
        out: dict[str, list[str]] = {}
        for n in names:
            out.setdefault(n.rsplit(".", 1)[0] if "." in n else n, []).append(n)
        return out
    try:
        prefix, _ = find_blocks(model)
    except ModuleSelectionError as exc:
        raise BlockError(f"partition {partition!r} needs decoder blocks: {exc}; use 'module' or 'parameter'") from exc
    modules = dict(model.named_modules())
    layers: dict[str, list[str]] = {}
    outside: dict[str, list[str]] = {}
    for n in names:
        layer, kind = _labels(model, n, prefix, modules)
        if partition == "kind":
            key = kind
        elif layer is None:
            key = kind
        else:
            key = layer if partition == "layer" else f"{layer}.{kind}"
        (layers if layer is not None and partition != "kind" else outside).setdefault(key, []).append(n)
    if partition == "kind":
        return outside
    order = sorted(layers, key=lambda k: (int(k.split(".")[0][5:]), k))
    return {**{k: layers[k] for k in order}, **outside}


def glob_groups(members: dict[str, list[str]]) -> dict[str, list[str]]:
    """``members`` as the mapping of literal globs :meth:`losslens.geometry.base.params.ParamSpace.groups` takes."""
    return {k: [literal_glob(n) for n in v] for k, v in members.items()}


__all__ = ["PARTITIONS", "BlockError", "block_members", "glob_groups", "module_kind"]
