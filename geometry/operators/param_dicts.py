"""Products on parameter dicts: ``matvec`` / ``matmat`` taking ``{name: Tensor}`` as well as flat tensors.

:class:`ParamDictProducts` gives an operator whose coordinates are model parameters (a
:class:`~losslens.geometry.base.params.ParamSpace` in ``space``) the dict form of its products, without
flattening: the vectors of each parameter are passed to the operator's ``_accumulate`` as
``[k, *shape]`` blocks. Cost: the operator's products; memory: the input and output dicts.
"""

from __future__ import annotations

from typing import Mapping

import torch

from losslens.geometry.operators.interface import OperatorError

__all__ = ["ParamDictProducts"]


class ParamDictProducts:
    """Mixin for a :class:`~losslens.geometry.operators.interface.CurvatureOperator` with ``space`` and
    ``_accumulate(vs, outs, reduce)`` (``outs[j] += (H V)_j`` per parameter, outputs reduced over ranks)."""

    def matvec(self, v: Mapping[str, torch.Tensor] | torch.Tensor) -> dict[str, torch.Tensor] | torch.Tensor:
        """``H v`` for one vector: a dict ``{name: Tensor[shape]}`` or a flat ``Tensor[dim]``;
        returns the same kind. Cost: one Hessian-vector product (see the class docstring)."""
        if isinstance(v, Mapping):
            self.space.check_dict(v)
            out = self.matmat({n: t.unsqueeze(0) for n, t in v.items()})
            return {n: t[0] for n, t in out.items()}
        if isinstance(v, torch.Tensor):
            return self.matvec_flat(v)
        raise OperatorError(f"matvec takes a dict of tensors or a flat tensor, got {type(v).__name__}")

    def matmat(self, V: Mapping[str, torch.Tensor] | torch.Tensor) -> dict[str, torch.Tensor] | torch.Tensor:
        """``H v_i`` for k vectors: a dict ``{name: Tensor[k, *shape]}`` or a flat ``Tensor[k, dim]``
        (vectors as rows); returns the same kind (in ``dtype``). Cost: k Hessian-vector products."""
        if isinstance(V, Mapping):
            k = self.space.check_dict(V, batched=True)
            if k == 0:
                raise OperatorError("k = 0: pass at least one vector")
            vs = [V[n].to(device=self.device, dtype=self.dtype) for n in self.space.names]
            outs = [torch.zeros_like(t) for t in vs]
            self._accumulate(vs, outs, reduce=outs)
            self.num_matvecs += k
            return dict(zip(self.space.names, outs))
        if isinstance(V, torch.Tensor):
            return self.matmat_flat(V)
        raise OperatorError(f"matmat takes a dict of tensors or a flat [k, dim] tensor, got {type(V).__name__}")
