"""losslens: loss geometry of language-model training trajectories.

Importing the package is light (no torch until a name is used).
"""

__all__ = ["LosslensError"]


def __getattr__(name: str):
    if name == "LosslensError":
        from losslens.geometry.base.errors import LosslensError

        return LosslensError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
