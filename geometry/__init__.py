"""losslens.geometry: curvature and loss surfaces of any differentiable loss (names imported on first use).

Model-agnostic (no transformers, no files): a loss is ``loss_fn(model, batch)`` over a fixed list
of batches, curvature is taken w.r.t. a declared parameter set (name globs).

- operators: :class:`HessianOperator` (batched HVPs, two backends), :class:`DenseOperator`,
  :func:`exact_hessian` (row-by-row double backward, the tests' ground truth);
- :func:`module_modes`: eval (or train) mode for a block, every module's own mode restored after;
- estimators: :func:`hutchinson_trace`, :func:`hutchpp_trace`, :func:`block_traces`,
  :func:`top_eigenvalues`, :func:`spectral_density`, :func:`directional_curvature`;
- attribution along a direction: :func:`attribute` (by factor ½‖d‖²·(tr H/n)·κ and by block),
  :func:`factorise`, :func:`direction_parts`, :func:`within_block_curvature`;
- surfaces: :func:`plane_through_points`, :func:`random_plane`, :func:`line`,
  :func:`evaluate_surface`, :func:`evaluate_line`, :class:`Surface`.
"""

from __future__ import annotations

from losslens.geometry.base.lazy import lazy_exports

_WHERE = {  # public name -> the module that defines it (imported on first use: PEP 562)
    "second_order_attention": "losslens.geometry.operators.attention",
    "DenseOperator": "losslens.geometry.operators.dense",
    "exact_hessian": "losslens.geometry.operators.dense",
    "spectral_density": "losslens.geometry.estimators.density",
    "directional_curvature": "losslens.geometry.estimators.directional",
    "top_eigenvalues": "losslens.geometry.estimators.eigen",
    "HessianOperator": "losslens.geometry.operators.hessian",
    "module_modes": "losslens.geometry.base.modes",
    "default_batch_weight": "losslens.geometry.base.batches",
    "CurvatureOperator": "losslens.geometry.operators.interface",
    "OperatorError": "losslens.geometry.operators.interface",
    "ParameterSelectionError": "losslens.geometry.base.params",
    "ParamSpace": "losslens.geometry.base.params",
    "select_parameters": "losslens.geometry.base.params",
    "GridError": "losslens.geometry.surfaces.grid",
    "GridSpec": "losslens.geometry.surfaces.grid",
    "Line": "losslens.geometry.surfaces.planes",
    "Plane": "losslens.geometry.surfaces.planes",
    "PlaneError": "losslens.geometry.surfaces.planes",
    "filter_normalize": "losslens.geometry.surfaces.random_planes",
    "line": "losslens.geometry.surfaces.point_planes",
    "orthonormality": "losslens.geometry.surfaces.planes",
    "plane_through_points": "losslens.geometry.surfaces.point_planes",
    "random_plane": "losslens.geometry.surfaces.random_planes",
    "BlockTraces": "losslens.geometry.base.results",
    "DirectionalCurvature": "losslens.geometry.base.results",
    "EigenResult": "losslens.geometry.base.results",
    "EstimatorError": "losslens.geometry.base.results",
    "SpectralDensity": "losslens.geometry.base.results",
    "TraceEstimate": "losslens.geometry.base.results",
    "Profile": "losslens.geometry.surfaces.surface",
    "Surface": "losslens.geometry.surfaces.surface",
    "SurfaceError": "losslens.geometry.surfaces.surface",
    "evaluate_line": "losslens.geometry.surfaces.surface",
    "evaluate_surface": "losslens.geometry.surfaces.surface",
    "block_traces": "losslens.geometry.estimators.blocks",
    "hutchinson_trace": "losslens.geometry.estimators.trace",
    "hutchpp_trace": "losslens.geometry.estimators.trace",
    "assemble": "losslens.geometry.estimators.attribution",
    "attribute": "losslens.geometry.estimators.attribution",
    "direction_parts": "losslens.geometry.estimators.attribution",
    "factorise": "losslens.geometry.estimators.attribution",
    "within_block_curvature": "losslens.geometry.estimators.attribution",
    "Attribution": "losslens.geometry.base.attribution_results",
    "DirectionParts": "losslens.geometry.base.attribution_results",
    "QuadraticFactors": "losslens.geometry.base.attribution_results",
    "LosslensError": "losslens.geometry.base.errors",
    "LosslensWarning": "losslens.geometry.base.errors",
    "ProductErrorWarning": "losslens.geometry.base.errors",
    "ZeroEmbeddingWarning": "losslens.geometry.base.errors",
}

__all__ = list(_WHERE)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _WHERE)
