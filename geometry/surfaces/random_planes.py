"""Random planes through a point: seeded Gaussian directions, filter-normalised (Li et al. 2018).

- :func:`random_plane` -- a plane through ``center`` spanned by two seeded N(0, I) directions,
  filter-normalised by default; x, y in units of the directions (docs/science.md §5);
- :func:`filter_normalize` -- each row of a direction rescaled to the norm of the weights' row.

Cost: two Gaussian draws and a constant number of passes over the parameters, one tensor at a time
(float64 temporaries of one tensor). Memory: the plane's three model-size dicts
(:func:`losslens.geometry.surfaces.planes.estimate_memory`), checked against ``max_memory`` first.
"""

from __future__ import annotations

import fnmatch
from typing import Sequence

import torch

from losslens.geometry.surfaces.planes import Params, Plane, PlaneError, _dot, _float_keys, _norm, estimate_memory

__all__ = ["random_plane", "filter_normalize"]


def _gaussian_like(ref: Params, keys: Sequence[str], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Seeded N(0, 1) directions, drawn on CPU in float32 so the numbers do not depend on the device."""
    return {
        k: torch.randn(ref[k].shape, generator=gen, dtype=torch.float32).to(device=ref[k].device, dtype=ref[k].dtype)
        for k in keys
    }


def _matches(name: str, patterns: Sequence[str]) -> bool:
    """A pattern matches when it is a substring of the name or an fnmatch glob matching it."""
    return any((p in name) or fnmatch.fnmatchcase(name, p) for p in patterns)


def filter_normalize(
    direction: Params,
    weights: Params,
    ignore: Sequence[str] = ("bias", "norm"),
    one_d: str = "zero",
    eps: float = 1e-10,
) -> dict[str, torch.Tensor]:
    """Filter normalisation of Li et al. (2018), returning a new dict.

    For every tensor with ≥ 2 dims, each row along dim 0 (an output unit of an ``nn.Linear``
    weight ``[out, in]``, a token row of an embedding, a filter of a conv) is rescaled to the norm
    of the same row of ``weights``: d_i ← d_i · ‖w_i‖ / (‖d_i‖ + eps) (eps as in the paper's code).
    Tensors whose name matches a pattern of ``ignore`` (substring or fnmatch glob) get a zero
    direction. 1-D tensors (biases, LayerNorm gains) follow ``one_d``:

    - ``"zero"`` (default; the paper's ``ignore='biasbn'`` convention): zero direction;
    - ``"weights"`` (the paper's other branch): the direction is a copy of the weights;
    - ``"filter"``: the whole vector is one filter, rescaled to ‖w‖.
    """
    return _filter_normalize_({k: d.clone() for k, d in direction.items()}, weights, ignore, one_d, eps)


def _filter_normalize_(
    direction: dict[str, torch.Tensor], weights: Params, ignore: Sequence[str], one_d: str, eps: float
) -> dict[str, torch.Tensor]:
    """:func:`filter_normalize` in place (float64 temporaries of one tensor at a time)."""
    if one_d not in ("zero", "weights", "filter"):
        raise PlaneError(f"one_d must be 'zero', 'weights' or 'filter', got {one_d!r}")
    for k, d in direction.items():
        w = weights[k]
        if _matches(k, ignore) or (d.ndim <= 1 and one_d == "zero"):
            d.zero_()
        elif d.ndim <= 1 and one_d == "weights":
            d.copy_(w.detach())
        elif d.ndim <= 1:
            d.mul_(float(w.double().norm() / (d.double().norm() + eps)))
        else:
            d2 = d.reshape(d.shape[0], -1)
            w2 = w.reshape(w.shape[0], -1).double()
            factor = w2.norm(dim=1, keepdim=True) / (d2.double().norm(dim=1, keepdim=True) + eps)
            d2.mul_(factor.to(d.dtype))
    return direction


def random_plane(
    center: Params,
    seed: int = 0,
    filter_normalize: bool = True,
    ignore: Sequence[str] = ("bias", "norm"),
    one_d: str = "zero",
    label: str = "center",
    max_memory: int | str | None = None,
) -> Plane:
    """A random plane through ``center`` (Li et al. 2018, "Visualizing the loss landscape").

    Two directions d₁, d₂ ~ N(0, I) drawn from ``torch.Generator().manual_seed(seed)`` (on CPU,
    float32, in key order: all of d₁ then all of d₂ -- same seed, same plane, on any device). With
    ``filter_normalize=True`` each is filter-normalised (:func:`filter_normalize`: rows rescaled to
    the weight rows' norms, ``ignore`` patterns and, by default, 1-D tensors zeroed). Without it
    the ``ignore`` patterns are still zeroed. As in the paper the directions are neither
    orthogonalised nor unit: x, y are in units of the directions (x = 1 moves every filter by its
    own norm), and ``norms`` records ``|e1|``, ``|e2|`` and their cosine (≈ 0 in high dimension).

    Returns a Plane with ``kind="random"``, ``coords={label: (0, 0)}``, ``scale=1``. Memory: three
    model-size dicts (:func:`estimate_memory`), checked against ``max_memory`` first.
    """
    keys = _float_keys([center], [label])
    estimate_memory(center, max_memory, "random")
    gen = torch.Generator().manual_seed(int(seed))
    d1 = _gaussian_like(center, keys, gen)
    d2 = _gaussian_like(center, keys, gen)
    ref = {k: center[k] for k in keys}
    if filter_normalize:
        _filter_normalize_(d1, ref, ignore, one_d, 1e-10)
        _filter_normalize_(d2, ref, ignore, one_d, 1e-10)
    else:
        for d in (d1, d2):
            for k in keys:
                if _matches(k, ignore):
                    d[k].zero_()
    n1, n2 = _norm(d1, keys), _norm(d2, keys)
    cos = _dot(d1, d2, keys) / (n1 * n2) if n1 > 0 and n2 > 0 else float("nan")
    if n1 == 0 or n2 == 0:
        raise PlaneError("every parameter was ignored: the random directions are zero; loosen `ignore` or `one_d`")
    origin = {k: center[k].detach().clone() for k in keys}
    return Plane(
        origin,
        d1,
        d2,
        {label: (0.0, 0.0)},
        {"|e1|": n1, "|e2|": n2, "cos(e1,e2)": cos, f"|{label}|": _norm(ref, keys)},
        kind="random",
        scale=1.0,
        meta={
            "seed": int(seed),
            "filter_normalize": bool(filter_normalize),
            "ignore": list(ignore),
            "one_d": one_d,
            "labels": [label],
        },
    )
