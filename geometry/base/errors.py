"""The base class of every error a user of losslens can cause.

Each room raises its own specific class (``EstimatorError``, ``PlanError``, ``CheckpointError``,
``ShardingError``, …); every one of them derives from :class:`LosslensError`, usually together with
the builtin it has always been (``ValueError``, ``RuntimeError``, …), so ``except ValueError`` in a
caller's code keeps working. The CLI (:mod:`losslens.cli.app`) prints a :class:`LosslensError` as one
``error: …`` line and exits 2; anything else that escapes a command is reported as an internal error
(exit 70). A test (``tests/test_errors_hierarchy.py``) imports every module of ``geometry`` and
``probes`` and checks that each exception class defined there derives from it.

This module imports nothing, so every room (``losslens.geometry.base`` included) can use it.
"""

from __future__ import annotations

__all__ = ["LosslensError"]


class LosslensError(Exception):
    """Something the user can fix (bad input, a missing or damaged file, a plan that cannot fit): its
    message says what was wrong and what to do. Subclasses add the builtin they refine."""
