"""Whether the top-level packages ``geometry`` and ``probes`` are losslens's own.

The losslens distribution installs two top-level packages, ``geometry`` and ``probes``. Both names
are taken by other projects on the package index; installing one of them beside losslens makes
pip write both into the same ``site-packages/geometry/`` (or ``probes/``) folder, each overwriting
the other's files, with no error. Two checks find it (:func:`namespace_clashes`):

- **another distribution owns the name**: :func:`importlib.metadata.packages_distributions` lists a
  distribution other than ``losslens`` for ``geometry`` or ``probes`` (from its ``top_level.txt``, or
  inferred from its ``RECORD``);
- **another folder shadows ours**: the ``geometry`` that Python would import does not lie beside this
  ``probes`` package (the two always ship side by side: in ``site-packages`` for a wheel, in the
  source tree for an editable install), e.g. an editable install of another project, or a folder
  named ``geometry`` in the working directory. An editable install of losslens itself lists no
  ``geometry/`` files in its ``RECORD`` (only its path hook), so the first check alone would miss
  this case.

``import probes`` runs the check once and warns (:class:`NamespaceClashWarning`, one line that says
what to do); the ``losslens`` command imports ``probes``, so it warns too. Cost: one
``packages_distributions()`` scan of the installed distributions' metadata (about 0.16 s with 200
distributions installed).
"""

from __future__ import annotations

import importlib.util
import warnings
from importlib.metadata import packages_distributions
from pathlib import Path

DISTRIBUTION = "losslens"
"""The distribution that owns the top-level packages below."""
TOP_LEVEL = ("geometry", "probes")
"""The top-level packages the losslens distribution installs."""
FIX = (
    "install losslens in a virtual environment of its own (python -m venv .venv), or pip uninstall the "
    "other distribution"
)
"""What to do about a clash (the end of every message)."""


class NamespaceClashWarning(UserWarning):
    """Another distribution or folder provides ``geometry`` or ``probes``: the imported code may not be losslens's."""


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def namespace_clashes(owners: dict[str, list[str]] | None = None) -> list[str]:
    """One line per clash found; empty when ``geometry`` and ``probes`` are losslens's own.

    Parameters
    ----------
    owners:
        top-level package name -> the distributions that install it, as returned by
        :func:`importlib.metadata.packages_distributions` (the default: read now).
    """
    owners = packages_distributions() if owners is None else owners
    lines = []
    for name in TOP_LEVEL:
        others = sorted({d for d in owners.get(name, []) if _canonical(d) != DISTRIBUTION})
        if others:
            lines.append(
                f"the top-level package '{name}' is installed by losslens and by {', '.join(others)}: "
                f"their files overwrite each other's; {FIX}"
            )
    here = Path(__file__).resolve().parent.parent
    spec = importlib.util.find_spec("geometry")
    origin = getattr(spec, "origin", None) if spec is not None else None
    if origin is not None and Path(origin).resolve().parent.parent != here:
        lines.append(
            f"'import geometry' finds {Path(origin).resolve().parent}, not losslens's {here / 'geometry'} "
            f"(another project's 'geometry' comes first on sys.path); {FIX}"
        )
    return lines


def warn_on_clash() -> list[str]:
    """Warn once per clash (:class:`NamespaceClashWarning`); returns the lines warned. Runs at import:
    a failure of the check itself (unreadable metadata of some other distribution) is not a clash and
    never stops the import."""
    try:
        lines = namespace_clashes()
    except Exception:  # noqa: BLE001 - e.g. a malformed dist-info elsewhere in site-packages
        return []
    for line in lines:
        warnings.warn(f"losslens: {line}", NamespaceClashWarning, stacklevel=3)
    return lines
