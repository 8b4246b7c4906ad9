"""losslens.geometry: curvature and loss surfaces of any differentiable loss.

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

from losslens.geometry.operators.attention import second_order_attention
from losslens.geometry.estimators.attribution import (
    assemble,
    attribute,
    direction_parts,
    factorise,
    within_block_curvature,
)
from losslens.geometry.base.batches import default_batch_weight
from losslens.geometry.base.errors import LosslensError
from losslens.geometry.operators.dense import DenseOperator, exact_hessian
from losslens.geometry.estimators.density import spectral_density
from losslens.geometry.estimators.directional import directional_curvature
from losslens.geometry.estimators.eigen import top_eigenvalues
from losslens.geometry.surfaces.grid import GridError, GridSpec
from losslens.geometry.operators.hessian import HessianOperator
from losslens.geometry.base.modes import module_modes
from losslens.geometry.operators.interface import CurvatureOperator, OperatorError
from losslens.geometry.base.params import ParameterSelectionError, ParamSpace, select_parameters
from losslens.geometry.surfaces.planes import Line, Plane, PlaneError, orthonormality
from losslens.geometry.surfaces.point_planes import line, plane_through_points
from losslens.geometry.surfaces.random_planes import filter_normalize, random_plane
from losslens.geometry.base.attribution_results import Attribution, DirectionParts, QuadraticFactors
from losslens.geometry.base.results import (
    BlockTraces,
    DirectionalCurvature,
    EigenResult,
    EstimatorError,
    SpectralDensity,
    TraceEstimate,
)
from losslens.geometry.surfaces.surface import Profile, Surface, SurfaceError, evaluate_line, evaluate_surface
from losslens.geometry.estimators.blocks import block_traces
from losslens.geometry.estimators.trace import hutchinson_trace, hutchpp_trace

__all__ = [
    "second_order_attention",
    "DenseOperator",
    "exact_hessian",
    "spectral_density",
    "directional_curvature",
    "top_eigenvalues",
    "HessianOperator",
    "module_modes",
    "default_batch_weight",
    "CurvatureOperator",
    "OperatorError",
    "ParameterSelectionError",
    "ParamSpace",
    "select_parameters",
    "GridError",
    "GridSpec",
    "Line",
    "Plane",
    "PlaneError",
    "filter_normalize",
    "line",
    "orthonormality",
    "plane_through_points",
    "random_plane",
    "BlockTraces",
    "DirectionalCurvature",
    "EigenResult",
    "EstimatorError",
    "SpectralDensity",
    "TraceEstimate",
    "Profile",
    "Surface",
    "SurfaceError",
    "evaluate_line",
    "evaluate_surface",
    "block_traces",
    "hutchinson_trace",
    "hutchpp_trace",
    "assemble",
    "attribute",
    "direction_parts",
    "factorise",
    "within_block_curvature",
    "Attribution",
    "DirectionParts",
    "QuadraticFactors",
    "LosslensError",
]
