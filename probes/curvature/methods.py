"""The curvature estimators a caller may name: :data:`TRACE_METHODS` (Hessian trace) and
:data:`EIGEN_METHODS` (top eigenvalues), as the sweep's plans and ``losslens sharpness`` spell them
(:mod:`geometry.estimators.trace`, :mod:`geometry.estimators.eigen`)."""

from __future__ import annotations

TRACE_METHODS = ("hutch++", "hutchinson")
"""Hessian trace estimators: Hutch++ and Hutchinson."""
EIGEN_METHODS = ("power", "lanczos")
"""Top-eigenvalue solvers: power iteration and Lanczos."""

__all__ = ["TRACE_METHODS", "EIGEN_METHODS"]
