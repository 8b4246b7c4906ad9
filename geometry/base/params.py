"""Parameter selection and the flat <-> dict views of a parameter set.

Curvature in losslens is always taken with respect to a *declared* parameter set: the trainable
parameters of a module whose dotted names match one or more globs. A :class:`ParamSpace` fixes
the order, shapes and flat offsets of that set so that dict-of-tensor vectors (pytrees) and flat
vectors of length ``dim`` can be converted both ways without ambiguity.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import torch
from torch import nn

from losslens.geometry.base.errors import LosslensError

ParamGlobs = str | Sequence[str] | None


class ParameterSelectionError(LosslensError, ValueError):
    """A parameter glob matched nothing, or a vector does not fit the parameter space."""


def _as_globs(params: ParamGlobs) -> list[str] | None:
    if params is None:
        return None
    if isinstance(params, str):
        return [params]
    globs = list(params)
    if not globs or not all(isinstance(g, str) for g in globs):
        raise ParameterSelectionError(
            f"params must be a glob string or a non-empty list of glob strings, got {params!r}"
        )
    return globs


def select_parameters(model: nn.Module, params: ParamGlobs = None) -> dict[str, nn.Parameter]:
    """Trainable parameters of ``model`` whose names match any of the globs, in module order.

    ``params=None`` selects every parameter with ``requires_grad``. Globs use :mod:`fnmatch`
    syntax on dotted names (``"layers.*.mlp.*"``, ``"*.weight"``). Each glob must match at least
    one trainable parameter, otherwise :class:`ParameterSelectionError` names the glob and a few
    available names. Tied parameters (one tensor under two names) appear once, under the first name.
    """
    globs = _as_globs(params)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise ParameterSelectionError("the model has no parameter with requires_grad=True")
    if globs is None:
        return dict(named)
    chosen: dict[str, nn.Parameter] = {}
    for glob in globs:
        hits = [(n, p) for n, p in named if fnmatch.fnmatchcase(n, glob)]
        if not hits:
            sample = ", ".join(n for n, _ in named[:6])
            raise ParameterSelectionError(
                f"parameter glob {glob!r} matches no trainable parameter; names look like: {sample}, ..."
            )
        for n, p in hits:
            chosen[n] = p
    order = {n: i for i, (n, _) in enumerate(named)}
    return dict(sorted(chosen.items(), key=lambda kv: order[kv[0]]))


@dataclass(frozen=True)
class ParamSpace:
    """Names, shapes and flat offsets of a parameter set.

    Flat vectors have shape ``[dim]`` or ``[k, dim]`` (k vectors as rows); dict vectors map each
    name to a tensor of the parameter's shape, or ``[k, *shape]`` when batched.
    """

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def from_params(cls, params: Mapping[str, torch.Tensor]) -> "ParamSpace":
        if not params:
            raise ParameterSelectionError("a parameter space needs at least one parameter")
        tensors = list(params.values())
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) != 1:
            raise ParameterSelectionError(
                f"selected parameters mix dtypes {sorted(map(str, dtypes))}; cast the model first"
            )
        return cls(tuple(params), tuple(t.shape for t in tensors), tensors[0].dtype, tensors[0].device)

    @property
    def numels(self) -> tuple[int, ...]:
        return tuple(int(torch.Size(s).numel()) for s in self.shapes)

    @property
    def dim(self) -> int:
        """Total number of scalar parameters."""
        return int(sum(self.numels))

    @property
    def slices(self) -> dict[str, slice]:
        """Flat index range of each parameter."""
        out, start = {}, 0
        for name, n in zip(self.names, self.numels):
            out[name] = slice(start, start + n)
            start += n
        return out

    def flatten(self, vec: Mapping[str, torch.Tensor], batched: bool = False) -> torch.Tensor:
        """Dict vector -> flat ``[dim]`` (or ``[k, dim]`` with ``batched=True``)."""
        self.check_dict(vec, batched=batched)
        if batched:
            k = vec[self.names[0]].shape[0]
            return torch.cat([vec[n].reshape(k, -1) for n in self.names], dim=1)
        return torch.cat([vec[n].reshape(-1) for n in self.names])

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Flat ``[dim]`` or ``[k, dim]`` -> dict of views with shapes ``shape`` or ``[k, *shape]``."""
        if flat.ndim not in (1, 2) or flat.shape[-1] != self.dim:
            raise ParameterSelectionError(
                f"flat vector has shape {tuple(flat.shape)}; expected [{self.dim}] or [k, {self.dim}]"
            )
        lead = flat.shape[:-1]
        return {n: flat[..., s].reshape(*lead, *shape) for (n, s), shape in zip(self.slices.items(), self.shapes)}

    def check_dict(self, vec: Mapping[str, torch.Tensor], batched: bool = False) -> int | None:
        """Check keys and shapes of a dict vector; return k when batched. Raises on any mismatch."""
        missing = [n for n in self.names if n not in vec]
        extra = [n for n in vec if n not in self.shapes_by_name]
        if missing or extra:
            raise ParameterSelectionError(
                f"vector keys do not match the parameter space: missing {missing[:4]}, unexpected {extra[:4]}"
            )
        ks = set()
        for n, shape in zip(self.names, self.shapes):
            got = tuple(vec[n].shape)
            want = tuple(shape)
            if batched:
                if got[1:] != want or len(got) != len(want) + 1:
                    raise ParameterSelectionError(f"{n}: batched vector has shape {got}, expected (k, *{want})")
                ks.add(got[0])
            elif got != want:
                raise ParameterSelectionError(f"{n}: vector has shape {got}, expected {want}")
        if batched:
            if len(ks) != 1:
                raise ParameterSelectionError(f"batched vector entries disagree on k: {sorted(ks)}")
            return ks.pop()
        return None

    @property
    def shapes_by_name(self) -> dict[str, torch.Size]:
        return dict(zip(self.names, self.shapes))

    def groups(self, groups: Mapping[str, ParamGlobs] | str) -> dict[str, list[str]]:
        """Partition names into named groups.

        ``groups`` is either a mapping ``{group_name: glob(s)}`` (each parameter goes to the first
        group whose glob matches; a parameter matched by no group goes to ``"other"``) or one of the
        strings ``"parameter"`` (one group per parameter) and ``"module"`` (one group per owning
        module, i.e. the name without its last component). Empty groups are dropped; every glob
        must match something.
        """
        if isinstance(groups, str):
            if groups == "parameter":
                return {n: [n] for n in self.names}
            if groups == "module":
                out: dict[str, list[str]] = {}
                for n in self.names:
                    out.setdefault(n.rsplit(".", 1)[0] if "." in n else n, []).append(n)
                return out
            raise ParameterSelectionError(f"groups must be a mapping of globs, 'parameter' or 'module'; got {groups!r}")
        out = {g: [] for g in groups}
        out["other"] = []
        for glob_list in groups.values():
            for glob in _as_globs(glob_list) or []:
                if not any(fnmatch.fnmatchcase(n, glob) for n in self.names):
                    raise ParameterSelectionError(f"group glob {glob!r} matches no parameter of the space")
        for n in self.names:
            for g, glob_list in groups.items():
                if any(fnmatch.fnmatchcase(n, glob) for glob in _as_globs(glob_list) or []):
                    out[g].append(n)
                    break
            else:
                out["other"].append(n)
        return {g: ns for g, ns in out.items() if ns}


def literal_glob(name: str) -> str:
    """A literal parameter name as an fnmatch glob that matches only it (``*?[]`` escaped)."""
    return "".join(f"[{c}]" if c in "*?[]" else c for c in name)


def iter_names(names: Iterable[str], globs: ParamGlobs) -> list[str]:
    """Names matching any glob (all names when ``globs`` is None)."""
    gl = _as_globs(globs)
    return [n for n in names if gl is None or any(fnmatch.fnmatchcase(n, g) for g in gl)]
