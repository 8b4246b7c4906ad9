"""losslens.probes: language-model measurements built on geometry.

Rooms (what each may import, and where to add things: ARCHITECTURE.md): :mod:`probes.core`,
:mod:`probes.checkpoints`, :mod:`probes.data`, :mod:`probes.models`, :mod:`probes.quant`,
:mod:`probes.train`, :mod:`probes.curvature`, :mod:`probes.sweep_probes`, :mod:`probes.sweep`,
:mod:`probes.analysis`, :mod:`probes.report`, and the
CLI (:mod:`probes.cli`, :mod:`probes.commands`, :mod:`probes.demo`).

Importing it checks that ``geometry`` and ``probes`` are losslens's own (:mod:`probes._namespace`:
both names are taken on the package index too) and warns when another distribution owns them.

:class:`~geometry.base.errors.LosslensError` is the base class of every error a user
can cause, in both packages; it is loaded on first use, so ``import probes`` stays light.
"""

from ._namespace import warn_on_clash as _warn_on_clash

_warn_on_clash()

__all__ = ["LosslensError"]


def __getattr__(name: str):
    if name == "LosslensError":  # loaded on first use: geometry imports torch
        from geometry.base.errors import LosslensError

        return LosslensError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
