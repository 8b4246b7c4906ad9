"""The base class of every error a user of losslens can cause.

Each room raises its own specific class (``EstimatorError``, ``PlanError``, ``CheckpointError``,
``ShardingError``, …); every one of them derives from :class:`LosslensError`, usually together with
the builtin it has always been (``ValueError``, ``RuntimeError``, …), so ``except ValueError`` in a
caller's code keeps working. The CLI (:mod:`losslens.cli.app`) prints a :class:`LosslensError` as one
``error: …`` line and exits 2; anything else that escapes a command is reported as an internal error
(exit 70). A test (``tests/test_errors_hierarchy.py``) imports every module of ``geometry`` and
``probes`` and checks that each exception class defined there derives from it.

Warnings follow the same rule: :class:`LosslensWarning` (a ``UserWarning``) is the base of every
warning losslens emits about a number it returns (``warnings.simplefilter("error", LosslensWarning)``
turns them all into exceptions, ``"ignore"`` silences them); :class:`ProductErrorWarning` says that
a curvature operator's measured product error exceeds its tolerance, :class:`ZeroEmbeddingWarning`
that a curvature loss counts tokens whose input-embedding row is zero.

This module imports nothing, so every room (``losslens.geometry.base`` included) can use it.
"""

from __future__ import annotations

__all__ = ["LosslensError", "LosslensWarning", "ProductErrorWarning", "ZeroEmbeddingWarning"]


class LosslensError(Exception):
    """Something the user can fix (bad input, a missing or damaged file, a plan that cannot fit): its
    message says what was wrong and what to do. Subclasses add the builtin they refine."""


class LosslensWarning(UserWarning):
    """A number losslens returns needs a caveat the user should act on: the message says what was
    measured and what to do. Filterable as a class (``warnings.filterwarnings("ignore", category=...)``)
    and raised as an exception under ``warnings.simplefilter("error")``."""


class ProductErrorWarning(LosslensWarning):
    """A curvature operator's Hessian-vector products were measured against exact products and the
    relative error exceeds the operator's tolerance (``HessianOperator.error_tolerance``): every number
    computed from them carries that error. Emitted once per operator
    (:mod:`losslens.geometry.operators.guarantees`)."""


class ZeroEmbeddingWarning(LosslensWarning):
    """A curvature operator's batches hold tokens whose input-embedding row is all zero (padding rows,
    never trained) and its loss does not leave them out: the curvature there is an artefact of the
    untrained row, and gradient differences are wrong there (:mod:`losslens.geometry.operators.guarantees`)."""
