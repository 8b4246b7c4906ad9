"""Finding the transformer blocks of a language model and the linear layers inside them.

A generic rule, no per-architecture table: the decoder blocks are the children of the largest
``nn.ModuleList`` whose entries all share one class (GPT-NeoX ``gpt_neox.layers``, Llama/OLMo
``model.layers``, GPT-2 ``transformer.h``). The default set of quantized matrices (docs/science.md §2)
is every ``nn.Linear`` inside those blocks; embeddings, LM head and norms stay full precision.
"""

from __future__ import annotations

import fnmatch
from typing import Sequence

from torch import nn

from losslens.geometry.base.errors import LosslensError


class ModuleSelectionError(LosslensError, ValueError):
    """No decoder blocks found, or a module glob matched nothing."""


def find_blocks(model: nn.Module) -> tuple[str, list[nn.Module]]:
    """Dotted name of the decoder-block ``ModuleList`` and its blocks, in execution order."""
    best: tuple[str, nn.ModuleList] | None = None
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) > 0 and len({type(m) for m in mod}) == 1:
            if any(isinstance(s, nn.Linear) for s in mod[0].modules()):
                if best is None or len(mod) > len(best[1]):
                    best = (name, mod)
    if best is None:
        raise ModuleSelectionError(
            f"{type(model).__name__}: found no nn.ModuleList of identical blocks containing nn.Linear layers; "
            "pass explicit module globs instead"
        )
    return best[0], list(best[1])


def select_linears(model: nn.Module, modules: str | Sequence[str] | None = None) -> dict[str, nn.Linear]:
    """``nn.Linear`` layers to quantize, by name, in module order.

    ``modules=None`` selects every Linear inside the decoder blocks (see :func:`find_blocks`).
    Otherwise each glob (fnmatch on dotted module names) must match at least one Linear.
    """
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    if modules is None:
        prefix, _ = find_blocks(model)
        chosen = {n: m for n, m in linears.items() if n.startswith(prefix + ".")}
        if not chosen:
            raise ModuleSelectionError(f"no nn.Linear inside the decoder blocks {prefix!r}")
        return chosen
    globs = [modules] if isinstance(modules, str) else list(modules)
    chosen = {}
    for g in globs:
        hits = {n: m for n, m in linears.items() if fnmatch.fnmatchcase(n, g)}
        if not hits:
            sample = ", ".join(list(linears)[:5])
            raise ModuleSelectionError(f"module glob {g!r} matches no nn.Linear; names look like: {sample}, ...")
        chosen.update(hits)
    return {n: linears[n] for n in linears if n in chosen}
